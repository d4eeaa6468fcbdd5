"""``relay function ls`` / ``inspect``: the spec's exact formats, rendered from a
real SQLite file in a temporary state directory."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from relay.adapters.sqlite.db import db_path, open_db, rfc3339
from relay.adapters.sqlite.state_view import SqliteStateView
from relay.domain.durations import SECOND
from relay.domain.events import (
    FunctionDiscovered,
    FunctionPrepared,
    FunctionReconcileFailed,
    FunctionSummary,
    HandlerSummary,
    ScheduleSummary,
)
from relay.entrypoints.cli import app
from relay.entrypoints.cli.fn_catalog import age, render_inspect, render_ls

NOW = 1_789_000_000.0
FP = "3f" * 32

SUMMARY = FunctionSummary(
    runtime="python3.14",
    concurrency=2,
    handlers=(
        HandlerSummary(handler="events.created.handler", timeout_ns=6 * SECOND, retries=4),
        HandlerSummary(handler="events.updated.handler", timeout_ns=20 * SECOND, retries=4),
        HandlerSummary(handler="events.deleted.handler", timeout_ns=6 * SECOND, retries=4),
    ),
    schedules=(
        ScheduleSummary(
            handler="jobs.cleanup.handler",
            cron="0 3 * * *",
            timezone="UTC",
            timeout_ns=6 * SECOND,
            retries=4,
        ),
        ScheduleSummary(
            handler="jobs.report.handler",
            cron="0 8 * * 1-5",
            timezone="Europe/Rome",
            timeout_ns=20 * SECOND,
            retries=4,
        ),
    ),
)


def prepared(
    name: str, runtime: str, at: float, summary: FunctionSummary = SUMMARY
) -> FunctionPrepared:
    return FunctionPrepared(
        name=name,
        directory=f"/functions/{name}",
        runtime=runtime,
        image=f"relay-fn-{name}:{FP[:16]}",
        fingerprint=FP,
        dependency_image=None,
        built=True,
        prepared_at=at,
        summary=summary,
    )


def row(event: FunctionPrepared) -> dict[str, object]:
    return {
        "name": event.name,
        "runtime": event.runtime,
        "status": "ready",
        "prepared_at": rfc3339(event.prepared_at),
    }


# --- pure rendering -------------------------------------------------------------
@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s ago"),
        (12, "12s ago"),
        (59, "59s ago"),
        (60, "1m ago"),
        (3 * 60 + 5, "3m ago"),
        (2 * 3600, "2h ago"),
        (5 * 86400, "5d ago"),
        (29 * 86400, "29d ago"),
        (31 * 86400, "2026-08-10"),
        (-5, "0s ago"),  # a clock slightly ahead never shows a negative age
    ],
)
def test_relative_ages(seconds: int, text: str) -> None:
    assert age(NOW - seconds, NOW) == text


def test_ls_matches_the_spec_example() -> None:
    rows = [
        row(prepared("welcome-email-node", "node24", NOW - 12)),
        row(prepared("user-events-python", "python3.14", NOW - 12)),
    ]
    assert render_ls(rows, NOW) == [
        "NAME                 RUNTIME     STATUS  UPDATED",
        "user-events-python   python3.14  ready   12s ago",
        "welcome-email-node   node24      ready   12s ago",
    ]


def test_ls_uses_updated_at_while_pending_and_widens_for_long_names() -> None:
    long_name = "a-function-with-a-rather-long-name"
    rows: list[dict[str, Any]] = [
        {"name": long_name, "status": "pending", "updated_at": rfc3339(NOW - 180)},
        {"name": "svc", "runtime": None, "status": "ready", "prepared_at": rfc3339(NOW - 7200)},
    ]
    assert render_ls(rows, NOW) == [
        f"{'NAME':<35}RUNTIME     STATUS  UPDATED",
        f"{long_name} -           pending 3m ago",
        f"{'svc':<35}-           ready   2h ago",
    ]


def test_ls_of_nothing_is_the_header() -> None:
    assert render_ls([], NOW) == ["NAME                 RUNTIME     STATUS  UPDATED"]


def _row_from_view(tmp_path: Path, *events: object) -> dict[str, object]:
    async def write() -> None:
        view = SqliteStateView(db_path(tmp_path))
        await view.open()
        for event in events:
            if isinstance(event, FunctionPrepared):
                await view.on_prepared(event)
            elif isinstance(event, FunctionReconcileFailed):
                await view.on_failed(event)
            elif isinstance(event, FunctionDiscovered):
                await view.on_discovered(event)
        await view.aclose()

    anyio.run(write)
    db = open_db(db_path(tmp_path))
    try:
        found = db.row("functions", "user-events-python")
    finally:
        db.close()
    assert found is not None
    return found[0]


def test_inspect_matches_the_spec_example(tmp_path: Path) -> None:
    data = _row_from_view(tmp_path, prepared("user-events-python", "python3.14", NOW - 12))
    stats = {
        "events_matched": 12493,
        "handler_success": 12470,
        "handler_failure": 23,
        "retries": 17,
        "dlq_entries": 2,
        "warm_acquires": 7,
        "cold_starts": 3,
        "discarded": 2,
    }
    pool = {"capacity": 4, "containers": 2, "busy": 1, "idle": 1, "starting": 1}
    assert render_inspect(data, stats, pool, NOW) == [
        "Name:            user-events-python",
        "Runtime:         python3.14",
        "Status:          ready",
        f"Image:           relay-fn-user-events-python:{FP[:16]}",
        f"Fingerprint:     {FP}",
        "Prepared:        2026-09-10T00:26:28Z (12s ago)",
        "Last reconcile:  success (12s ago)",
        "Events:",
        "  events.created.handler  timeout=6s",
        "  events.updated.handler  timeout=20s",
        "  events.deleted.handler  timeout=6s",
        "Schedules:",
        '  jobs.cleanup.handler  cron="0 3 * * *" (At 03:00) timezone=UTC',
        "                        next: 2026-09-10T03:00:00Z (2026-09-10T03:00:00+00:00 UTC)",
        '  jobs.report.handler   cron="0 8 * * 1-5" (At 08:00, Monday through Friday)'
        " timezone=Europe/Rome timeout=20s",
        "                        next: 2026-09-10T06:00:00Z"
        " (2026-09-10T08:00:00+02:00 Europe/Rome)",
        "Stats:",
        "  Events matched:     12493",
        "  Handler successes:  12470",
        "  Handler failures:   23",
        "  Retries:            17",
        "  DLQ entries:        2",
        "Runtime pool:",
        "  Capacity:       4",
        "  Containers:     2",
        "  Busy:           1",
        "  Idle:           1",
        "  Starting:       1",
        "  Warm acquires:  7",
        "  Cold starts:    3",
        "  Discarded:      2",
    ]


def test_inspect_after_a_failed_reconcile_keeps_ready_and_shows_the_error(
    tmp_path: Path,
) -> None:
    ok = prepared("user-events-python", "python3.14", NOW - 3600)
    failed = FunctionReconcileFailed(
        name="user-events-python",
        error="build failed: step 3/5 exited 1\nfull log follows",
        at=NOW - 180,
        runtime="python3.14",
        image=ok.image,
        fingerprint=FP,
        prepared_at=ok.prepared_at,
        summary=FunctionSummary(
            runtime="python3.14",
            concurrency=2,
            env={"API_URL": "https://api.example.com"},
            secrets={"DATABASE_URL": "database-url"},
        ),
    )
    data = _row_from_view(tmp_path, ok, failed)
    lines = render_inspect(data, {}, None, NOW)
    assert lines[2] == "Status:          ready"
    assert lines[5] == "Prepared:        2026-09-09T23:26:40Z (1h ago)"
    assert lines[6:8] == [
        "Last reconcile:  failed (3m ago)",
        "Last error:      build failed: step 3/5 exited 1",
    ]
    assert lines[8:] == [
        "Stats:",
        "  Events matched:     0",
        "  Handler successes:  0",
        "  Handler failures:   0",
        "  Retries:            0",
        "  DLQ entries:        0",
        "Environment:",
        "  API_URL=https://api.example.com",
        "Secrets:",
        "  DATABASE_URL=database-url",
        "Runtime pool:",
        "  Capacity:       unknown",
        "  Containers:     unknown",
        "  Busy:           unknown",
        "  Idle:           unknown",
        "  Warm acquires:  0",
        "  Cold starts:    0",
        "  Discarded:      0",
    ]


def test_inspect_while_pending_omits_image_fingerprint_and_prepared(tmp_path: Path) -> None:
    data = _row_from_view(
        tmp_path,
        FunctionDiscovered(name="user-events-python", directory="/f", summary=SUMMARY, at=NOW - 5),
    )
    lines = render_inspect(data, {}, None, NOW)
    assert lines[:4] == [
        "Name:            user-events-python",
        "Runtime:         python3.14",
        "Status:          pending",
        "Events:",
    ]
    assert not any(
        line.startswith(("Image:", "Fingerprint:", "Prepared:", "Last")) for line in lines
    )


def test_an_undescribable_cron_falls_back_to_the_raw_expression() -> None:
    data = {
        "name": "fn",
        "status": "pending",
        "schedules": [{"handler": "a.b", "cron": "*/7 1,2 * * *", "timezone": "UTC"}],
    }

    def broken(_cron: str) -> str | None:
        raise ValueError("no")

    lines = render_inspect(data, {}, None, NOW, describe=broken)
    assert '  a.b  cron="*/7 1,2 * * *" timezone=UTC' in lines
    assert '  a.b  cron="*/7 1,2 * * *" timezone=UTC' in render_inspect(
        data, {}, None, NOW, describe=lambda _c: None
    )


# --- the commands, reading only the database file -----------------------------------
@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"RELAY_STATE_DIR": str(tmp_path / "state"), "RELAY_RUN_DIR": str(tmp_path / "run")}


def test_ls_without_a_database_prints_an_empty_list_and_creates_nothing(
    env: dict[str, str],
) -> None:
    result = CliRunner().invoke(app, ["function", "ls"], env=env)
    assert result.exit_code == 0
    assert result.stdout == "NAME                 RUNTIME     STATUS  UPDATED\n"
    assert not Path(env["RELAY_STATE_DIR"]).exists()


def test_inspect_of_an_unknown_function_fails_with_one_line(env: dict[str, str]) -> None:
    result = CliRunner().invoke(app, ["function", "inspect", "x"], env=env)
    assert result.exit_code == 1
    assert result.stderr == 'relay: function "x" not found\n'


def test_ls_and_inspect_read_the_database_file(env: dict[str, str]) -> None:
    state = Path(env["RELAY_STATE_DIR"])
    _row_from_view(state, prepared("user-events-python", "python3.14", time.time() - 125))
    db = open_db(db_path(state))
    db.upsert("function_stats", "user-events-python", {"events_matched": 5, "cold_starts": 1}, "x")
    db.close()

    listed = CliRunner().invoke(app, ["function", "ls"], env=env)
    assert listed.exit_code == 0
    assert listed.stdout.splitlines()[1] == "user-events-python   python3.14  ready   2m ago"

    shown = CliRunner().invoke(app, ["function", "inspect", "user-events-python"], env=env)
    assert shown.exit_code == 0
    assert "  Events matched:     5" in shown.stdout.splitlines()
    assert "  Cold starts:    1" in shown.stdout.splitlines()
    assert "  Capacity:       unknown" in shown.stdout.splitlines()


def test_inspect_shows_catchup_overlap_and_skips_a_next_line_it_cannot_compute() -> None:
    data = {
        "name": "jobs",
        "status": "ready",
        "schedules": [
            {"handler": "a.b", "cron": "*/5 * * * * *", "timezone": "Europe/Rome",
             "catchup": "2h", "overlap": "skip", "timeout": "6s", "retries": 4},
            {"handler": "a.c", "cron": "0 3 * * *", "timezone": "Not/AZone"},
        ],
    }
    lines = render_inspect(data, {}, None, NOW)
    assert (
        '  a.b  cron="*/5 * * * * *" (Every 5 seconds) timezone=Europe/Rome catchup=2h '
        "overlap=skip"
    ) in lines
    assert "       next: 2026-09-10T00:26:45Z (2026-09-10T02:26:45+02:00 Europe/Rome)" in lines
    at = lines.index('  a.c  cron="0 3 * * *" (At 03:00) timezone=Not/AZone')
    assert not lines[at + 1].strip().startswith("next:")
