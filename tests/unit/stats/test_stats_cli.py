from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

from relay.adapters.control.lock import ProcessLock
from relay.adapters.control.server import ControlServer
from relay.adapters.sqlite.db import open_db
from relay.adapters.sqlite.stats_store import read_stats, write_stats
from relay.application.bus import MessageBus, Outcome
from relay.domain.commands import ResetStats
from relay.domain.stats import StatsSnapshot
from relay.entrypoints.cli import app
from relay.entrypoints.cli.stats import render_stats, stats_document

FRESH = """\
Events received:     0
Events matched:      0
Events unmatched:    0
Handler successes:   0
Handler failures:    0
Retries:             0
DLQ entries:         0
Pending entries:     0
Oldest pending age:  0s
Updated:             never
"""


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RELAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RELAY_RUN_DIR", str(tmp_path / "run"))
    return tmp_path


def test_render_matches_the_spec_format() -> None:
    snap = StatsSnapshot(
        totals={"events_received": 153000, "events_matched": 152934, "events_unmatched": 66,
                "handler_success": 152801, "handler_failure": 133, "retries": 82,
                "dlq_entries": 4, "pending_entries": 17, "oldest_pending_age_seconds": 134},
        updated_at=1000.0,
    )
    assert "\n".join(render_stats(snap, 1010.0)) + "\n" == """\
Events received:     153000
Events matched:      152934
Events unmatched:    66
Handler successes:   152801
Handler failures:    133
Retries:             82
DLQ entries:         4
Pending entries:     17
Oldest pending age:  2m14s
Updated:             10s ago
"""


def test_delayed_entries_show_after_pending_only_when_there_are_some() -> None:
    snap = StatsSnapshot(totals={"pending_entries": 2, "delayed_entries": 40},
                         updated_at=1000.0)  # fmt: skip
    lines = render_stats(snap, 1010.0)
    at = lines.index("Pending entries:     2")
    assert lines[at + 1] == "Delayed entries:     40"
    assert stats_document(snap)["delayed_entries"] == 40
    assert not any("Delayed" in line for line in render_stats(StatsSnapshot(), 1010.0))


def test_missing_database_shows_zeros_and_never(dirs: Path) -> None:
    result = CliRunner().invoke(app, ["stats"])
    assert result.exit_code == 0, result.output
    assert result.stdout == FRESH
    assert not (dirs / "state").exists()  # reading leaves no trace


def test_fresh_database_shows_zeros_and_never(dirs: Path) -> None:
    open_db(dirs / "state" / "db.sqlite3").close()
    result = CliRunner().invoke(app, ["stats"])
    assert result.exit_code == 0, result.output
    assert result.stdout == FRESH


def test_reset_without_a_worker_rewrites_the_database(dirs: Path) -> None:
    db = open_db(dirs / "state" / "db.sqlite3")
    write_stats(
        db,
        StatsSnapshot(totals={"events_received": 9, "pending_entries": 2},
                      functions={"fn": {"events_matched": 9}}),
        1000.0,
    )
    result = CliRunner().invoke(app, ["stats", "reset"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "Statistics reset\n"
    after = read_stats(db)
    assert after.total("events_received") == 0
    assert after.total("pending_entries") == 2
    assert after.function("fn")["events_matched"] == 0
    db.close()


def test_reset_on_missing_database_creates_nothing(dirs: Path) -> None:
    result = CliRunner().invoke(app, ["stats", "reset"])
    assert result.exit_code == 0, result.output
    assert not (dirs / "state").exists()


@pytest.mark.anyio
async def test_reset_goes_through_the_worker_when_one_answers(dirs: Path) -> None:
    resets: list[ResetStats] = []

    async def handle(cmd: ResetStats) -> Outcome[None]:
        resets.append(cmd)
        return Outcome(None)

    with ProcessLock(dirs / "run") as lock:
        server = ControlServer(lock, MessageBus({ResetStats: handle}).send)
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            result = await anyio.to_thread.run_sync(
                lambda: CliRunner().invoke(app, ["stats", "reset"])
            )
            tg.cancel_scope.cancel()
    assert result.exit_code == 0, result.output
    assert resets == [ResetStats()]
    assert not (dirs / "state").exists()  # the worker owns the write, not the CLI
