"""The EventPublisher contract (issue 33): plain, delayed and idempotent appends, on
the in-memory fake, on Redis and on the embedded broker's file: one suite, the
same tests for all three.

Each bed says what a consumer could read now (``visible``: on Redis after one
run of the mover every worker runs) and how many events wait delayed; ``wait``
lets ``ms`` pass (the fake clock on the fake and the file; the real one on Redis,
whose server clock decides when an event is due)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio

from relay.adapters.redis.keys import delayed_key
from relay.adapters.redis.producer import DelayedMover, RedisEventPublisher
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.application.ports import EventPublisher
from relay.domain.publication import InvalidPublication, Publication
from tests.contract.conftest import redis_url_for
from tests.fakes import FakeClock, InMemoryEventStream
from tests.fakes_publishing import InMemoryEventPublisher

pytestmark = pytest.mark.anyio

DELAY_MS = 300  # short: the Redis bed lets it pass for real
WINDOW_NS = 60 * 10**9


class Bed:
    publisher: EventPublisher

    def now_ms(self) -> int:
        raise NotImplementedError

    async def visible(self) -> list[bytes]:
        raise NotImplementedError

    async def delayed(self) -> int:
        raise NotImplementedError

    async def wait(self, ms: int) -> None:
        raise NotImplementedError


class MemoryBed(Bed):
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.stream = InMemoryEventStream(self.clock)
        self.fake = InMemoryEventPublisher(self.stream, self.clock, dedup_window_ns=WINDOW_NS)
        self.publisher = self.fake

    def now_ms(self) -> int:
        return self.fake.now_ms()

    async def visible(self) -> list[bytes]:
        self.fake.move_due()
        return [p for p in self.stream.entries.values() if p is not None]

    async def delayed(self) -> int:
        return len(self.fake.delayed)

    async def wait(self, ms: int) -> None:
        self.clock.advance(ms / 1000)


class RedisBed(Bed):
    def __init__(self, client: redis.asyncio.Redis, stream: str) -> None:
        self.client = client
        self.stream = stream
        self.publisher = RedisEventPublisher(client, stream, dedup_window_ns=WINDOW_NS)
        self.mover = DelayedMover(client, stream)

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    async def visible(self) -> list[bytes]:
        await self.mover.move_due()
        rows: Any = await self.client.xrange(self.stream)
        return [fields[b"event"] for _, fields in rows]

    async def delayed(self) -> int:
        return int(await self.client.zcard(delayed_key(self.stream)))

    async def wait(self, ms: int) -> None:
        until = self.now_ms() + ms
        with anyio.fail_after(10):
            while self.now_ms() <= until:  # noqa: ASYNC110 - the wall clock, no event
                await anyio.sleep(0.01)


class SqliteBed(Bed):
    def __init__(self, store: BrokerStore, clock: FakeClock) -> None:
        self.store = store
        self.clock = clock
        self.publisher = SqliteEventPublisher(store, "events", dedup_window_ns=WINDOW_NS)

    def now_ms(self) -> int:
        return self.store.now_ms()

    async def visible(self) -> list[bytes]:
        now = self.now_ms()
        return await self.store.read(lambda c: [bytes(p) for (p,) in c.execute(
            "SELECT payload FROM jobs WHERE state = 'ready' AND coalesce(ready_ms, 0) <= ?"
            " ORDER BY seq", (now,))])

    async def delayed(self) -> int:
        now = self.now_ms()

        def count(c: sqlite3.Connection) -> int:
            return int(c.execute(
                "SELECT count(*) FROM jobs WHERE state = 'ready' AND ready_ms > ?", (now,)
            ).fetchone()[0])

        return await self.store.read(count)

    async def wait(self, ms: int) -> None:
        self.clock.advance(ms / 1000)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis), "sqlite"])
async def bed(
    request: pytest.FixtureRequest, unique: str, tmp_path: Path
) -> AsyncIterator[Bed]:
    if request.param == "memory":
        yield MemoryBed()
    elif request.param == "redis":
        client = redis.asyncio.Redis.from_url(redis_url_for(request))
        try:
            yield RedisBed(client, f"{unique}-events")
        finally:
            await client.aclose()
    else:
        clock = FakeClock()
        store = BrokerStore(tmp_path / "broker.sqlite3", clock)
        try:
            yield SqliteBed(store, clock)
        finally:
            store.close()


def ev(n: int) -> bytes:
    return b'{"n": %d}' % n


async def test_plain_appends_are_visible_in_order_with_distinct_ids(bed: Bed) -> None:
    assert await bed.publisher.append([]) == []
    ids = await bed.publisher.append([Publication(ev(n)) for n in range(3)])
    assert len(set(ids)) == 3
    assert await bed.visible() == [ev(0), ev(1), ev(2)]
    assert await bed.delayed() == 0


async def test_a_delayed_append_waits_until_its_time_then_is_visible_once(bed: Bed) -> None:
    [delayed] = await bed.publisher.append(
        [Publication(ev(1), deliver_at_ms=bed.now_ms() + DELAY_MS)]
    )
    assert delayed
    assert await bed.visible() == []
    assert await bed.delayed() == 1
    await bed.wait(DELAY_MS + 1)
    assert await bed.visible() == [ev(1)]
    assert await bed.visible() == [ev(1)]  # moved once, not again
    assert await bed.delayed() == 0


async def test_a_time_in_the_past_is_now(bed: Bed) -> None:
    await bed.publisher.append([Publication(ev(1), deliver_at_ms=bed.now_ms() - 3_600_000)])
    assert await bed.visible() == [ev(1)]
    assert await bed.delayed() == 0


async def test_options_out_of_bounds_are_refused_before_anything_is_written(bed: Bed) -> None:
    too_far = bed.now_ms() + 366 * 86_400_000
    with pytest.raises(InvalidPublication, match="365 days"):
        await bed.publisher.append([Publication(ev(1)), Publication(ev(2), deliver_at_ms=too_far)])
    for key in ("", "with space", "x" * 129, "naïve", "new\nline"):
        with pytest.raises(InvalidPublication, match="idempotency key"):
            await bed.publisher.append(
                [Publication(ev(3)), Publication(ev(4), idempotency_key=key)]
            )
    assert await bed.visible() == []
    assert await bed.delayed() == 0


async def test_a_key_appended_again_adds_nothing_and_answers_the_first_id(bed: Bed) -> None:
    [first] = await bed.publisher.append([Publication(ev(1), idempotency_key="order-1")])
    batch = await bed.publisher.append([
        Publication(ev(2), idempotency_key="order-1"),
        Publication(ev(3), idempotency_key="order-2"),
        Publication(ev(4), idempotency_key="order-2"),
    ])
    assert batch[0] == first
    assert batch[1] == batch[2] != first
    assert await bed.visible() == [ev(1), ev(3)]


async def test_a_delayed_keyed_append_answers_its_first_id_and_waits_once(bed: Bed) -> None:
    one = Publication(ev(1), deliver_at_ms=bed.now_ms() + DELAY_MS, idempotency_key="remind")
    [first] = await bed.publisher.append([one])
    assert await bed.publisher.append([one]) == [first]
    assert await bed.delayed() == 1
    await bed.wait(DELAY_MS + 1)
    assert await bed.visible() == [ev(1)]
    assert await bed.publisher.append([one]) == [first]  # still within the window
    assert await bed.visible() == [ev(1)]
