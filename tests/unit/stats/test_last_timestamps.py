"""The per-function ``Last*`` execution timestamps: fed by domain events, snapshot,
persisted as RFC3339, restored at start, removed by a reset, shown by ``inspect``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relay.adapters.metrics.registry import Metrics
from relay.adapters.metrics.subscribers import subscribe
from relay.adapters.sqlite.db import open_db, rfc3339
from relay.adapters.sqlite.stats_store import SqliteStatsStore
from relay.application.bus import MessageBus
from relay.application.stats import StatsRecorder
from relay.domain import events as ev
from relay.domain.stats import StatsSnapshot, since_baseline, zeroed
from relay.entrypoints.cli.fn_catalog import render_inspect
from tests.fakes import FakeClock, InMemoryStatsStore
from tests.fakes_compose import deliver

pytestmark = pytest.mark.anyio

T0 = 1_800_000_000.0


def wired(clock: FakeClock) -> tuple[MessageBus, Metrics]:
    bus, metrics = MessageBus({}), Metrics(clock=clock.now)
    subscribe(bus, metrics)
    return bus, metrics


def succeeded(function: str) -> ev.InvocationSucceeded:
    return ev.InvocationSucceeded(
        function=function, handler="h", message_id="1-0", attempt=1, duration_s=0.1
    )


def failed(function: str) -> ev.InvocationFailed:
    return ev.InvocationFailed(
        function=function, handler="h", message_id="1-0", attempt=1, duration_s=0.1,
        error="boom", retry_in_s=60,
    )


def dead_lettered(function: str) -> ev.MessageDeadLettered:
    return ev.MessageDeadLettered(
        function=function, handler="h", message_id="1-0", entry_id="9-0",
        handler_attempts=5, reason="boom",
    )


async def test_domain_events_stamp_each_function_once_per_kind() -> None:
    clock = FakeClock(T0)
    bus, m = wired(clock)
    assert m.snapshot().timestamps == {}
    await deliver(bus, [ev.EventClassified(message_id="1-0", matched=True, functions=("fn",))])
    clock.advance(10)
    await deliver(bus, [succeeded("fn")])
    clock.advance(10)
    await deliver(bus, [failed("fn")])
    clock.advance(10)
    await deliver(bus, [
        ev.InvocationExhausted(function="fn", handler="h", message_id="1-0", attempt=5,
                               duration_s=0.0, error="boom"),
        dead_lettered("fn"),
        dead_lettered("-"),  # a malformed message: counted globally, no function
        ev.EventClassified(message_id="2-0", matched=False),
        ev.HandlerInvoked(function="fn", handler="h", ok=True, duration_s=0.1),  # manual
    ])
    snap = m.snapshot()
    assert snap.last("fn") == {
        "last_matched_at": T0,
        "last_success_at": T0 + 10,
        "last_failure_at": T0 + 30,  # the exhausted attempt failed too
        "last_dlq_at": T0 + 30,
    }
    assert set(snap.timestamps) == {"fn"}
    m.function_removed("fn")
    assert m.snapshot().timestamps == {}


def test_baseline_keeps_only_timestamps_that_moved_and_zeroed_drops_them() -> None:
    base = StatsSnapshot(
        functions={"fn": {"events_matched": 1}},
        timestamps={"fn": {"last_matched_at": T0, "last_success_at": T0}},
    )
    now = StatsSnapshot(
        functions={"fn": {"events_matched": 2}, "new": {"events_matched": 1}},
        timestamps={
            "fn": {"last_matched_at": T0 + 5, "last_success_at": T0, "last_dlq_at": T0 + 1},
            "new": {"last_matched_at": T0 + 6},
        },
    )
    since = since_baseline(now, base)
    assert since.timestamps == {
        "fn": {"last_matched_at": T0 + 5, "last_dlq_at": T0 + 1},
        "new": {"last_matched_at": T0 + 6},
    }
    assert since_baseline(base, base).timestamps == {}
    reset = zeroed(now)
    assert reset.timestamps == {}
    assert set(reset.functions) == {"fn", "new"}


async def test_sqlite_persists_rfc3339_restores_and_reset_removes(tmp_path: Path) -> None:
    db = open_db(tmp_path / "db.sqlite3")
    store = SqliteStatsStore(db)
    snap = StatsSnapshot(
        functions={"fn": {"events_matched": 3}},
        timestamps={"fn": {"last_matched_at": T0, "last_failure_at": T0 + 62}},
    )
    await store.save(snap, T0 + 70)
    found = db.row("function_stats", "fn")
    assert found is not None
    data = found[0]
    assert data["last_matched_at"] == "2027-01-15T08:00:00Z"
    assert data["last_failure_at"] == "2027-01-15T08:01:02Z"
    assert "last_success_at" not in data
    assert "last_dlq_at" not in data
    loaded = await store.load()
    assert loaded.last("fn") == {"last_matched_at": T0, "last_failure_at": T0 + 62}
    await store.reset(T0 + 80)
    after = db.row("function_stats", "fn")
    assert after is not None
    assert not any(key.startswith("last_") for key in after[0])
    assert after[0]["events_matched"] == 0  # the row is kept, zeroed in place
    assert (await store.load()).timestamps == {}
    # an unreadable stored value reads as unset
    with db.transaction() as conn:
        conn.execute(
            "UPDATE function_stats SET data = ? WHERE function_name = 'fn'",
            (json.dumps({"last_success_at": "yesterday"}),),
        )
    assert (await store.load()).timestamps == {}
    db.close()


async def test_restart_restores_and_a_worker_reset_continues_without_them() -> None:
    clock = FakeClock(T0)
    store = InMemoryStatsStore()
    bus, m = wired(clock)
    recorder = StatsRecorder(m, store, clock)
    await deliver(bus, [succeeded("fn")])
    await recorder.flush()
    assert store.persisted.last("fn") == {"last_success_at": T0}
    # a restarted worker restores them, and they stay when nothing new happened
    clock.advance(100)
    bus2, m2 = wired(clock)
    restarted = StatsRecorder(m2, store, clock)
    await restarted.restore()
    await restarted.flush()
    assert store.persisted.last("fn") == {"last_success_at": T0}
    # a worker-owned reset: removed, and the old value never comes back
    await restarted.reset()
    assert store.persisted.timestamps == {}
    await restarted.flush()
    assert store.persisted.timestamps == {}
    clock.advance(5)
    await deliver(bus2, [failed("fn")])
    await restarted.flush()
    assert store.persisted.last("fn") == {"last_failure_at": T0 + 105}


NOW = 1_800_000_000.0


def test_inspect_shows_the_set_timestamps_after_the_counters() -> None:
    stats = {
        "events_matched": 12493,
        "handler_success": 12470,
        "handler_failure": 23,
        "retries": 17,
        "dlq_entries": 2,
        "last_matched_at": rfc3339(NOW - 12),
        "last_success_at": rfc3339(NOW - 180),
        "last_dlq_at": rfc3339(NOW - 7200),
    }
    lines = render_inspect({"name": "fn", "status": "pending"}, stats, None, NOW)
    start = lines.index("Stats:")
    assert lines[start + 1 : start + 9] == [
        "  Events matched:     12493",
        "  Handler successes:  12470",
        "  Handler failures:   23",
        "  Retries:            17",
        "  DLQ entries:        2",
        "  Last matched:       2027-01-15T07:59:48Z (12s ago)",
        "  Last success:       2027-01-15T07:57:00Z (3m ago)",
        "  Last DLQ entry:     2027-01-15T06:00:00Z (2h ago)",
    ]
    assert lines[start + 9] == "Runtime pool:"
    unset = render_inspect({"name": "fn", "status": "pending"}, {"events_matched": 1}, None, NOW)
    assert not any("Last " in line for line in unset)
