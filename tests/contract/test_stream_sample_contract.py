"""The ``StreamSample`` port (what a dry run reads): the same tests against Redis and the
embedded broker. Newest first, across pages, bounded by ``limit`` and ``since_ms``, a
missing ``event`` field as ``None``, and each entry's time from its id."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
import redis.asyncio

from relay.adapters.redis.stream_sample import PAGE, RedisStreamSample
from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.sample import SqliteStreamSample
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock
from relay.application.dry_run import SampledEntry, StreamNotFound
from relay.application.ports import StreamSample
from relay.domain.retention import StreamId
from tests.contract.conftest import redis_url_for

pytestmark = pytest.mark.anyio

COUNT = PAGE * 2 + 7  # three pages


class Bed:
    sample: StreamSample
    missing: StreamSample  # a stream name nothing was ever appended to

    async def add(self, payloads: list[bytes | None], created_ms: int) -> None:
        raise NotImplementedError


class RedisBed(Bed):
    def __init__(self, client: redis.asyncio.Redis, unique: str) -> None:
        self.client = client
        self.name = f"{unique}-events"
        self.sample = RedisStreamSample(client, self.name)
        self.missing = RedisStreamSample(client, f"{unique}-nothing")
        self._seq = 0

    async def add(self, payloads: list[bytes | None], created_ms: int) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            for payload in payloads:
                self._seq += 1
                fields = {"event": payload} if payload is not None else {"other": b"x"}
                pipe.xadd(self.name, fields, id=f"{created_ms}-{self._seq}")  # type: ignore[arg-type]  # bytes values
            await pipe.execute()


class SqliteBed(Bed):
    def __init__(self, store: BrokerStore) -> None:
        self.store = store
        self.sample = SqliteStreamSample(store, "events")
        self.missing = SqliteStreamSample(store, "nothing")

    async def add(self, payloads: list[bytes | None], created_ms: int) -> None:
        await self.store.write(
            lambda c, _: [jobs.publish(c, created_ms, "events", p, 2) for p in payloads]
        )


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "sqlite"])
async def bed(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Bed]:
    if request.param == "sqlite":
        path = tmp_path / "broker.sqlite3"
        store = await anyio.to_thread.run_sync(BrokerStore, path, SystemClock())
        try:
            yield SqliteBed(store)
        finally:
            await anyio.to_thread.run_sync(store.close)
        return
    unique: str = request.getfixturevalue("unique")
    client = redis.asyncio.Redis.from_url(redis_url_for(request), decode_responses=False)
    b = RedisBed(client, unique)
    try:
        yield b
    finally:
        await client.delete(b.name)
        await client.aclose()


async def read(sample: StreamSample, *, since_ms: int | None, limit: int) -> list[SampledEntry]:
    return [e async for e in sample.newest(since_ms=since_ms, limit=limit)]


async def test_entries_come_newest_first_across_pages_up_to_the_limit(bed: Bed) -> None:
    now_ms = await bed.sample.server_ms()
    await bed.add([b'{"n": %d}' % n for n in range(COUNT)], now_ms)
    await bed.sample.check()

    every = await read(bed.sample, since_ms=None, limit=COUNT + 100)
    some = await read(bed.sample, since_ms=None, limit=PAGE + 1)

    assert [e.payload for e in every] == [b'{"n": %d}' % n for n in reversed(range(COUNT))]
    assert len({e.id for e in every}) == COUNT
    assert [StreamId.parse(e.id) for e in every] == sorted(
        (StreamId.parse(e.id) for e in every), reverse=True
    )
    assert all(e.at == now_ms / 1000 for e in every)  # the id's milliseconds
    assert [e.id for e in some] == [e.id for e in every[: PAGE + 1]]


async def test_since_stops_at_older_entries_and_a_missing_event_field_is_none(bed: Bed) -> None:
    now_ms = await bed.sample.server_ms()
    await bed.add([b'{"old": 1}'], now_ms - 3_600_000)
    await bed.add([b'{"new": 1}', None], now_ms)

    recent = await read(bed.sample, since_ms=now_ms - 60_000, limit=100)
    every = await read(bed.sample, since_ms=None, limit=100)

    assert [e.payload for e in recent] == [None, b'{"new": 1}']
    assert [e.payload for e in every] == [None, b'{"new": 1}', b'{"old": 1}']
    assert every[-1].at == (now_ms - 3_600_000) / 1000


async def test_a_stream_nothing_was_appended_to(bed: Bed) -> None:
    await bed.add([b"{}"], await bed.sample.server_ms())
    # Redis: the key does not exist; the broker file: it holds other streams only
    with pytest.raises(StreamNotFound):
        await bed.missing.check()
    assert await read(bed.missing, since_ms=None, limit=10) == []
