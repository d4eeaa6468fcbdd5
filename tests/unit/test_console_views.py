"""What the console's pages show, without HTTP: the overview's chart columns and the
functions page (state view rows, schedules' last and next occurrence, breakers)."""

from __future__ import annotations

import json
from pathlib import Path

from relay.adapters.fs.templates import load_template_text
from relay.adapters.sqlite.run_history import RollupRow, open_history_db
from relay.adapters.sqlite.state_view import summary_fields
from relay.application.bus import MessageBus
from relay.application.function_summary import summarize
from relay.application.registry import ActiveFunction, FunctionRegistry
from relay.domain import events as ev
from relay.domain.execution import PoolSnapshot
from relay.entrypoints.console import views

NOW = 1_800_000_030.0  # 30 s into a minute
TEMPLATE = """\
runtime: python3.14
events:
  - handler: jobs.on_event
    pattern: {kind: [x]}
schedules:
  - handler: jobs.nightly
    cron: "0 3 * * *"
"""


def _row(minute: int, received: int, p50: float | None) -> RollupRow:
    return RollupRow(minute, "*", received, received, 1, 0, p50, p50)


def test_chart_columns_have_one_point_per_minute_and_zero_for_empty_ones() -> None:
    first = int(NOW // 60) * 60 - 120
    series = views.chart_series([_row(first, 120, 0.25)], since=first, now=NOW)
    assert series["t"] == [first, first + 60, first + 120]
    assert series["events_s"] == [2.0, 0, 0]
    assert series["failed"] == [1, 0, 0]
    assert series["p50_ms"] == [250.0, None, None]


def test_the_chart_json_cannot_end_its_script_element(tmp_path: Path) -> None:
    db = open_history_db(tmp_path / "db.sqlite3")
    text = views.overview_charts(db, NOW)
    assert "</" not in text
    assert len(json.loads(text)["hour"]["t"]) == 61
    db.close()


def test_functions_show_status_version_breaker_and_schedule_times(tmp_path: Path) -> None:
    template = load_template_text(TEMPLATE)
    db = open_history_db(tmp_path / "db.sqlite3")
    row = {**summary_fields(summarize(template)), "status": "ready", "fingerprint": "a" * 64,
           "image": "relay-fn-nightly:aaaa"}
    db.upsert("functions", "nightly", row, "2027-01-15T08:00:00Z")
    db.upsert("functions", "broken", {"status": "failed", "last_error": "bad template"}, "")
    registry = FunctionRegistry()
    registry.put(ActiveFunction(name="nightly", directory="/f/nightly", template=template,
                                runtime="python3.14", image="relay-fn-nightly:aaaa",
                                fingerprint="a" * 64, prepared_at=1.0))
    breakers = views.Breakers()
    bus = MessageBus({})
    breakers.subscribe(bus)
    bus.emit(ev.BreakerOpened(function="nightly", cause="failures", failures=5,
                                cooldown_s=30))
    pools = {"nightly": PoolSnapshot(capacity=4, containers=3, busy=2, idle=1, starting=0,
                                     warm_acquires=9, cold_starts=3, discarded=0)}
    broken, nightly = views.function_rows(db, registry, breakers, NOW, pools)
    assert (nightly["pool"], broken["pool"]) == ("2 busy, 1 idle of 4", "-")
    assert (broken["name"], broken["status"], broken["why"]) == ("broken", "failed",
                                                                  "bad template")
    assert (nightly["version"], nightly["breaker"], nightly["handlers"]) == (
        "a" * 12, "open", ["jobs.on_event"])
    [nightly_schedule] = nightly["schedules"]
    assert nightly_schedule["cron"] == "0 3 * * *"
    assert nightly_schedule["last"] == "2027-01-15T03:00:00Z"
    assert nightly_schedule["next"] == "2027-01-16T03:00:00Z"
    bus.emit(ev.BreakerClosed(function="nightly", cause="probe_succeeded"))
    assert breakers.open == []
    db.close()
