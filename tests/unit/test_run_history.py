"""The run history projection and its per-minute rollups (issue 34 item 1).

Real bus, real SQLite file under ``tmp_path``, the fake clock: the subscriber only
queues, the flush writes, pruning keeps the limit and the windows.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from relay.adapters.sqlite.db import open_db
from relay.adapters.sqlite.run_history import (
    RunHistory,
    RunHistorySettings,
    recent_runs,
    rollup_rows,
    run_names,
)
from relay.application.bus import MessageBus
from relay.domain import events as ev
from relay.domain import run_history as rh
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio


def _history(tmp_path: Path, clock: FakeClock, **kw: object) -> tuple[MessageBus, RunHistory]:
    bus = MessageBus({})
    settings = kw.pop("settings", None)
    history = RunHistory(tmp_path / "db.sqlite3", settings, clock=clock.now, **kw)  # type: ignore[arg-type]
    history.subscribe(bus)
    return bus, history


def _ok(n: int, duration: float = 0.1, function: str = "fn") -> ev.InvocationSucceeded:
    return ev.InvocationSucceeded(
        function=function, handler="h", message_id=f"1-{n}", attempt=1, duration_s=duration
    )


async def test_subscriber_only_queues_and_the_flush_writes(tmp_path: Path) -> None:
    clock = FakeClock()
    bus, history = _history(tmp_path, clock)
    bus.emit(_ok(1))
    bus.emit(ev.InvocationFailed(function="fn", handler="h", message_id="1-2", attempt=1,
                                   duration_s=0.2, error="boom"))
    assert not (tmp_path / "db.sqlite3").exists()  # nothing written on the delivery path
    assert await history.flush() == 2
    db = open_db(tmp_path / "db.sqlite3")
    runs = recent_runs(db)
    assert [(r.outcome, r.error) for r in runs] == [("failed", "boom"), ("succeeded", "")]
    assert [r.message_id for r in recent_runs(db, outcome="succeeded")] == ["1-1"]
    assert run_names(db) == (["fn"], ["h"])
    await history.aclose()


async def test_a_full_queue_drops_and_counts_never_blocks(tmp_path: Path) -> None:
    clock = FakeClock()
    bus, history = _history(tmp_path, clock, capacity=3)
    for n in range(5):
        bus.emit(_ok(n))
    assert history.dropped == 2
    assert await history.flush() == 3
    await history.aclose()


async def test_pruning_keeps_the_newest_limit_and_the_retention_window(tmp_path: Path) -> None:
    clock = FakeClock()
    settings = RunHistorySettings(limit=3, retention_s=3600, rollup_retention_s=7200)
    bus, history = _history(tmp_path, clock, settings=settings)
    for n in range(5):
        bus.emit(_ok(n))
    await history.flush()
    db = open_db(tmp_path / "db.sqlite3")
    assert [r.message_id for r in recent_runs(db)] == ["1-4", "1-3", "1-2"]
    clock.advance(3601)
    bus.emit(_ok(9))
    await history.flush()
    assert [r.message_id for r in recent_runs(db)] == ["1-9"]  # older than the window: gone
    clock.advance(7200)
    bus.emit(_ok(10))
    await history.flush()
    minutes = rollup_rows(db, since=0)
    assert [row.minute for row in minutes] == [rh.minute_of(clock.now())]
    await history.aclose()


async def test_rollups_count_per_function_and_for_all(tmp_path: Path) -> None:
    clock = FakeClock(now=1_800_000_000.0)  # a minute boundary
    bus, history = _history(tmp_path, clock)
    bus.emit(ev.EventClassified(message_id="1-1", matched=True, functions=("a", "b")))
    bus.emit(ev.EventClassified(message_id="1-2", matched=False))
    bus.emit(_ok(1, 0.5, "a"))
    bus.emit(ev.InvocationExhausted(function="b", handler="h", message_id="1-1", attempt=3,
                                      duration_s=1.5, error="exit 1"))
    bus.emit(ev.MessageDeadLettered(function="b", handler="h", message_id="1-1",
                                      entry_id="9-0", handler_attempts=3, reason="x"))
    await history.flush()
    # more in the same minute, after a first write: counts add up, never doubled
    bus.emit(_ok(2, 1.0, "a"))
    await history.flush()
    db = open_db(tmp_path / "db.sqlite3")
    (everything,) = rollup_rows(db, since=clock.now())
    assert (everything.received, everything.succeeded, everything.failed,
            everything.dead_lettered) == (2, 2, 1, 1)
    (a,) = rollup_rows(db, since=clock.now(), function="a")
    assert (a.received, a.succeeded, a.failed, a.p50_s, a.p99_s) == (1, 2, 0, 0.5, 1.0)
    (b,) = rollup_rows(db, since=clock.now(), function="b")
    assert (b.received, b.failed, b.dead_lettered) == (1, 1, 1)
    await history.aclose()


async def test_manual_runs_are_listed_but_not_rolled_up(tmp_path: Path) -> None:
    clock = FakeClock()
    bus, history = _history(tmp_path, clock)
    bus.emit(ev.HandlerInvoked(function="fn", handler="h", ok=True, duration_s=0.1))
    await history.flush()
    db = open_db(tmp_path / "db.sqlite3")
    assert [(r.kind, r.outcome) for r in recent_runs(db)] == [("manual", "succeeded")]
    assert rollup_rows(db, since=0) == []
    await history.aclose()


async def test_a_broken_database_drops_the_batch_and_delivery_goes_on(tmp_path: Path) -> None:
    clock = FakeClock()
    (tmp_path / "db.sqlite3").mkdir()  # a directory where the file should be
    bus, history = _history(tmp_path, clock)
    bus.emit(_ok(1))
    assert await history.flush() == 0
    assert history.dropped == 1


def test_percentiles_are_nearest_rank_and_the_sample_is_bounded() -> None:
    assert rh.percentile([], 0.5) is None
    assert rh.percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert rh.percentile([float(n) for n in range(1, 101)], 0.99) == 99.0
    bucket = rh.MinuteRollup()
    rng = random.Random(1)
    for n in range(rh.SAMPLES_PER_MINUTE * 4):
        bucket.add_duration(float(n), rng)
    assert len(bucket.durations) == rh.SAMPLES_PER_MINUTE
    assert bucket.seen == rh.SAMPLES_PER_MINUTE * 4


def test_errors_are_clipped() -> None:
    assert len(rh.clip_error("x" * 5000)) == rh.ERROR_CHARS
    assert rh.clip_error("short") == "short"
