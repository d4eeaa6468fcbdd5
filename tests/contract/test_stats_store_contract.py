"""The StatsStore contract, on the in-memory fake and on the SQLite state database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.adapters.sqlite.db import open_db
from relay.adapters.sqlite.stats_store import SqliteStatsStore
from relay.application.ports import StatsStore
from relay.domain.stats import (
    BACKLOG_GAUGES,
    FUNCTION_COUNTERS,
    GLOBAL_COUNTERS,
    GLOBAL_KEYS,
    StatsSnapshot,
)
from tests.fakes import InMemoryStatsStore

pytestmark = pytest.mark.anyio

AT = 1_900_000_000.0  # 2030-03-17T17:46:40Z
SNAPSHOT = StatsSnapshot(
    totals={"events_received": 5, "events_matched": 4, "dlq_entries": 1,
            "pending_entries": 3, "oldest_pending_age_seconds": 70, "delayed_entries": 5},
    functions={"fn-a": {"events_matched": 4, "warm_acquires": 2}, "fn-b": {}},
    timestamps={"fn-a": {"last_matched_at": AT - 60, "last_dlq_at": AT - 5}},
)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StatsStore]:
    if request.param == "memory":
        yield InMemoryStatsStore()
        return
    db = open_db(tmp_path / "state" / "relay.sqlite3")
    try:
        yield SqliteStatsStore(db)
    finally:
        db.close()


async def test_an_empty_store_loads_zeros_never_persisted(store: StatsStore) -> None:
    assert await store.load() == StatsSnapshot()


async def test_a_saved_snapshot_loads_back_whole(store: StatsStore) -> None:
    await store.save(SNAPSHOT, AT)
    loaded = await store.load()
    assert loaded.totals == {key: SNAPSHOT.total(key) for key in GLOBAL_KEYS}
    assert loaded.functions == {
        "fn-a": {key: SNAPSHOT.function("fn-a")[key] for key in FUNCTION_COUNTERS},
        "fn-b": dict.fromkeys(FUNCTION_COUNTERS, 0),
    }
    assert loaded.timestamps == SNAPSHOT.timestamps
    assert loaded.updated_at == AT


async def test_times_are_kept_to_the_second(store: StatsStore) -> None:
    fractional = StatsSnapshot(timestamps={"fn-a": {"last_success_at": AT + 0.75}})
    await store.save(fractional, AT + 0.5)
    loaded = await store.load()
    assert (loaded.updated_at, loaded.last("fn-a")) == (AT, {"last_success_at": AT})


async def test_a_save_replaces_the_listed_rows_and_keeps_the_others(store: StatsStore) -> None:
    await store.save(SNAPSHOT, AT)
    later = StatsSnapshot(totals={"events_received": 9}, functions={"fn-b": {"retries": 2}})
    await store.save(later, AT + 10)
    loaded = await store.load()
    assert loaded.total("events_received") == 9
    assert loaded.total("pending_entries") == 0  # the global row is replaced whole
    assert loaded.function("fn-b")["retries"] == 2
    assert loaded.function("fn-a")["warm_acquires"] == 2  # not listed: its row stays
    assert loaded.last("fn-a") == SNAPSHOT.last("fn-a")
    assert loaded.updated_at == AT + 10


async def test_reset_zeroes_counters_in_place_and_keeps_gauges(store: StatsStore) -> None:
    await store.save(SNAPSHOT, AT)
    await store.reset(AT + 30)
    after = await store.load()
    assert {key: after.total(key) for key in GLOBAL_COUNTERS} == dict.fromkeys(GLOBAL_COUNTERS, 0)
    assert {key: after.total(key) for key in BACKLOG_GAUGES} == {
        "pending_entries": 3, "oldest_pending_age_seconds": 70, "delayed_entries": 5}
    assert after.functions == dict.fromkeys(("fn-a", "fn-b"), dict.fromkeys(FUNCTION_COUNTERS, 0))
    assert after.timestamps == {}
    assert after.updated_at == AT + 30


async def test_reset_of_an_empty_store_writes_zero_rows(store: StatsStore) -> None:
    await store.reset(AT)
    after = await store.load()
    assert after.totals == dict.fromkeys(GLOBAL_KEYS, 0)
    assert (after.functions, after.updated_at) == ({}, AT)
