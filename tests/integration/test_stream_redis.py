"""RedisEventStream against a real Redis: group creation, reads, reclaim, deleted bodies."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from relay.adapters.redis.stream import RedisEventStream
from tests.integration.delivery_support import bytes_client, text

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


@pytest.fixture
async def bytes_redis(request: pytest.FixtureRequest) -> AsyncIterator[redis.asyncio.Redis]:
    async with bytes_client(request) as client:
        yield client


def consumer(client: redis.asyncio.Redis, unique: str, name: str = "w1") -> RedisEventStream:
    return RedisEventStream(client, stream=f"{unique}-events", group="relay", consumer=name)


async def test_a_new_group_starts_at_zero_and_replays_the_backlog(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    stream = consumer(bytes_redis, unique)
    before = text(await bytes_redis.xadd(stream.stream, {"event": b'{"n": 1}'}))
    await stream.ensure_group()
    await stream.ensure_group()  # idempotent
    messages = await stream.read(10, 10)
    assert [(m.id, m.payload, m.deliveries) for m in messages] == [(before, b'{"n": 1}', 1)]


async def test_a_missing_event_field_reads_as_none(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    stream = consumer(bytes_redis, unique)
    await stream.ensure_group()
    await bytes_redis.xadd(stream.stream, {"other": b"x"})
    [message] = await stream.read(10, 10)
    assert message.payload is None


async def test_reclaim_reports_deleted_bodies_and_delivery_counts(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    first = consumer(bytes_redis, unique, "w1")
    second = consumer(bytes_redis, unique, "w2")
    await first.ensure_group()
    kept = text(await bytes_redis.xadd(first.stream, {"event": b"{}"}))
    gone = text(await bytes_redis.xadd(first.stream, {"event": b"{}"}))
    await first.read(10, 10)
    await bytes_redis.xdel(first.stream, gone)
    batch = await second.reclaim(0, 10)
    assert [(m.id, m.reclaimed, m.deliveries) for m in batch.messages] == [(kept, True, 2)]
    assert batch.deleted == (gone,)
    assert batch.complete
    await second.drop(batch.deleted)
    rows = await bytes_redis.xpending_range(first.stream, "relay", min="-", max="+", count=10)
    assert [(text(r["message_id"]), text(r["consumer"])) for r in rows] == [(kept, "w2")]


async def test_reclaim_leaves_messages_that_are_not_idle_long_enough(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    stream = consumer(bytes_redis, unique)
    await stream.ensure_group()
    await bytes_redis.xadd(stream.stream, {"event": b"{}"})
    await stream.read(10, 10)
    batch = await stream.reclaim(60_000, 10)
    assert batch.messages == ()


async def test_a_vanished_group_is_recreated_on_read(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    stream = consumer(bytes_redis, unique)
    await stream.ensure_group()
    await bytes_redis.delete(stream.stream)  # as a Redis that lost its data
    assert await stream.read(10, 10) == []
    new = text(await bytes_redis.xadd(stream.stream, {"event": b"{}"}))
    assert [m.id for m in await stream.read(10, 10)] == [new]
