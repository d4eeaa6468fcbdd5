from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from relay.adapters.metrics.registry import Metrics
from relay.adapters.sqlite.db import open_db
from relay.adapters.sqlite.stats_store import SqliteStatsStore
from relay.application.stats import StatsRecorder
from relay.domain.stats import StatsSnapshot
from tests.fakes import FakeClock, InMemoryStatsStore

pytestmark = pytest.mark.anyio


def counted(n: int) -> Metrics:
    m = Metrics()
    for _ in range(n):
        m.event_classified(matched=True, functions=["fn"])
        m.invocation_finished("fn", "h", ok=True)
    return m


async def test_sqlite_round_trip_and_reset_in_place(tmp_path: Path) -> None:
    db = open_db(tmp_path / "db.sqlite3")
    store = SqliteStatsStore(db)
    empty = await store.load()
    assert empty.updated_at is None
    assert empty.total("events_received") == 0
    snap = StatsSnapshot(
        totals={"events_received": 5, "events_matched": 4, "events_unmatched": 1,
                "pending_entries": 3, "oldest_pending_age_seconds": 70},
        functions={"fn": {"events_matched": 4, "warm_acquires": 2}, "other": {}},
    )
    await store.save(snap, 1_800_000_000.0)
    loaded = await store.load()
    assert loaded.total("events_received") == 5
    assert loaded.total("oldest_pending_age_seconds") == 70
    assert loaded.function("fn")["warm_acquires"] == 2
    assert loaded.updated_at == 1_800_000_000.0
    await store.reset(1_800_000_010.0)
    after = await store.load()
    assert after.total("events_received") == 0
    assert after.total("pending_entries") == 3  # gauges are not reset
    assert set(after.functions) == {"fn", "other"}  # rows kept, zeroed
    assert after.function("fn") == dict.fromkeys(after.function("fn"), 0)
    db.close()


async def test_restore_then_flush_stays_monotonic(tmp_path: Path) -> None:
    db = open_db(tmp_path / "db.sqlite3")
    store = SqliteStatsStore(db)
    first = StatsRecorder(counted(3), store, FakeClock())
    await first.flush()
    # a restarted worker: fresh registry, restored from the database
    metrics = counted(0)
    second = StatsRecorder(metrics, store, FakeClock())
    await second.restore()
    metrics.event_classified(matched=False)
    await second.flush()
    loaded = await store.load()
    assert loaded.total("events_received") == 4
    assert loaded.total("events_matched") == 3
    assert loaded.total("events_unmatched") == 1
    assert loaded.function("fn")["handler_success"] == 3
    db.close()


async def test_reset_baseline_continues_from_zero_without_touching_prometheus() -> None:
    metrics = counted(5)
    store = InMemoryStatsStore()
    rec = StatsRecorder(metrics, store, FakeClock())
    await rec.flush()
    await rec.reset()
    assert store.persisted.total("events_received") == 0
    metrics.event_classified(matched=True, functions=["fn"])
    await rec.flush()
    assert store.persisted.total("events_received") == 1
    assert store.persisted.function("fn")["events_matched"] == 1
    assert metrics.registry.get_sample_value("events_received_total") == 6


async def test_no_pre_reset_snapshot_lands_after_the_reset() -> None:
    metrics = counted(5)
    store = InMemoryStatsStore()
    store.gate = anyio.Event()
    rec = StatsRecorder(metrics, store, FakeClock())
    async with anyio.create_task_group() as tg:
        tg.start_soon(rec.flush)  # captures the pre-reset snapshot, then blocks in save
        await store.saving.wait()
        tg.start_soon(rec.reset)
        await anyio.wait_all_tasks_blocked()
        assert [kind for kind, _ in store.writes] == []  # the reset waits for the flush
        store.gate.set()
    kinds = [kind for kind, _ in store.writes]
    assert kinds == ["save", "reset"]
    assert store.persisted.total("events_received") == 0
    await rec.flush()
    assert store.persisted.total("events_received") == 0


async def test_run_flushes_periodically_and_once_at_shutdown() -> None:
    metrics = counted(1)
    store = InMemoryStatsStore()
    rec = StatsRecorder(metrics, store, FakeClock(), interval_s=0.01)
    async with anyio.create_task_group() as tg:
        await tg.start(rec.run)
        with anyio.fail_after(10):
            await store.saving.wait()
        tg.cancel_scope.cancel()
    count = len(store.writes)
    assert count >= 2  # at least one periodic flush plus the final one
    metrics.event_classified(matched=False)
    assert len(store.writes) == count


async def test_broken_store_is_logged_not_fatal() -> None:
    class Broken(InMemoryStatsStore):
        async def save(self, snapshot: StatsSnapshot, at: float) -> None:
            raise OSError("disk full")

        async def load(self) -> StatsSnapshot:
            raise OSError("unreadable")

    rec = StatsRecorder(counted(1), Broken(), FakeClock(), interval_s=0.01)
    with capture_logs() as logs:
        await rec.restore()
        async with anyio.create_task_group() as tg:
            await tg.start(rec.run)
            with anyio.fail_after(10):
                while not any(e["event"] == "stats_flush_failed" for e in logs):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    events = [e["event"] for e in logs]
    assert events.count("stats_flush_failed") == 1  # logged once while failing, not per tick
    assert "stats_restore_failed" in events


async def test_a_function_added_back_after_a_reset_counts_from_its_new_series() -> None:
    metrics = counted(5)
    store = InMemoryStatsStore()
    rec = StatsRecorder(metrics, store, FakeClock())
    await rec.reset()
    metrics.function_removed("fn")
    metrics.function_activated("fn")
    metrics.event_classified(matched=True, functions=["fn"])
    await rec.flush()
    assert store.persisted.function("fn")["events_matched"] == 1
    assert store.persisted.total("events_matched") == 1
