"""RedisOccurrencePublisher specifics beyond the shared contract suite: the Lua
script's atomicity, the entry's exact bytes, the dedup key's TTL and value."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio

from relay.adapters.redis.schedules import RedisOccurrencePublisher, latest_published
from relay.domain import schedule
from relay.domain.errors import DependencyUnavailable
from tests.integration.delivery_support import bytes_client

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

AT = 1_900_000_000  # 2030-03-17T17:46:40Z


@pytest.fixture
async def client(request: pytest.FixtureRequest) -> AsyncIterator[redis.asyncio.Redis]:
    async with bytes_client(request) as c:
        yield c


async def test_the_entry_is_the_envelope_byte_for_byte(
    client: redis.asyncio.Redis, unique: str
) -> None:
    stream = f"{unique}-events"
    publisher = RedisOccurrencePublisher(client, stream)
    entry_id = await publisher.publish(schedule.envelope(f"fn-{unique}", "jobs.report.handler", AT))
    rows: Any = await client.xrange(stream)
    assert [(i.decode(), fields) for i, fields in rows] == [
        (
            entry_id,
            {
                b"event": (
                    b'{"source":"relay.schedule","function":"fn-' + unique.encode() + b'",'
                    b'"handler":"jobs.report.handler","scheduled_at":"2030-03-17T17:46:40Z",'
                    b'"occurrence_id":"schedule:fn-' + unique.encode() + b':jobs.report.handler:'
                    b'2030-03-17T17:46:40Z"}'
                )
            },
        )
    ]


async def test_the_dedup_key_holds_the_entry_id_for_seven_days(
    client: redis.asyncio.Redis, unique: str
) -> None:
    publisher = RedisOccurrencePublisher(client, f"{unique}-events")
    occurrence = schedule.envelope(f"fn-{unique}", "jobs.a", AT)
    entry_id = await publisher.publish(occurrence)
    key = f"relay:occurrence:{unique}-events:schedule:fn-{unique}:jobs.a:2030-03-17T17:46:40Z"
    assert key == schedule.dedup_key(f"{unique}-events", occurrence.occurrence_id)
    assert (await client.get(key)) == str(entry_id).encode()
    ttl = int(await client.ttl(key))
    assert 7 * 86400 - 60 <= ttl <= 7 * 86400
    # a second publish adds nothing and leaves the key as it was
    assert await publisher.publish(occurrence) is None
    assert int(await client.xlen(f"{unique}-events")) == 1
    assert (await client.get(key)) == str(entry_id).encode()


async def test_a_failing_xadd_leaves_no_key(client: redis.asyncio.Redis, unique: str) -> None:
    stream = f"{unique}-events"
    await client.set(stream, b"not a stream")  # XADD answers WRONGTYPE
    publisher = RedisOccurrencePublisher(client, stream)
    occurrence = schedule.envelope(f"fn-{unique}", "jobs.a", AT)
    with pytest.raises(DependencyUnavailable, match="WRONGTYPE"):
        await publisher.publish(occurrence)
    assert await client.exists(schedule.dedup_key(stream, occurrence.occurrence_id)) == 0
    # once the stream can take it, the same occurrence publishes normally
    await client.delete(stream)
    assert await publisher.publish(occurrence) is not None
    assert int(await client.xlen(stream)) == 1


async def test_latest_published_reads_the_dedup_keys(
    client: redis.asyncio.Redis, unique: str
) -> None:
    publisher = RedisOccurrencePublisher(client, f"{unique}-events")
    fn = f"fn-{unique}"
    for at in (AT, AT + 3600, AT + 60):
        await publisher.publish(schedule.envelope(fn, "jobs.a", at))
    await publisher.publish(schedule.envelope(fn, "jobs.ab", AT + 7200))  # another schedule
    prefix = schedule.schedule_prefix(fn, "jobs.a")
    none = schedule.schedule_prefix(fn, "jobs.none")
    assert await latest_published(client, f"{unique}-events", [prefix, none]) == {
        prefix: schedule.occurrence_id(fn, "jobs.a", AT + 3600)
    }


async def test_two_streams_on_one_redis_each_get_their_occurrences(
    client: redis.asyncio.Redis, unique: str
) -> None:
    """Issue 35.4: prod and staging on one Redis, the same function and handler
    names: each stream gets every occurrence once (before, the second got none)."""
    prod = RedisOccurrencePublisher(client, f"{unique}-prod")
    staging = RedisOccurrencePublisher(client, f"{unique}-staging")
    for at in range(AT, AT + 5 * 60, 60):
        occurrence = schedule.envelope(f"fn-{unique}", "jobs.a", at)
        for publisher in (prod, staging, prod, staging):  # each worker offers it twice
            await publisher.publish(occurrence)
    assert int(await client.xlen(f"{unique}-prod")) == 5
    assert int(await client.xlen(f"{unique}-staging")) == 5
    prefix = schedule.schedule_prefix(f"fn-{unique}", "jobs.a")
    last = {prefix: schedule.occurrence_id(f"fn-{unique}", "jobs.a", AT + 4 * 60)}
    assert await latest_published(client, f"{unique}-staging", [prefix]) == last
    assert await latest_published(client, f"{unique}-other", [prefix]) == {}


async def test_a_key_of_the_previous_layout_still_counts_as_published(
    client: redis.asyncio.Redis, unique: str
) -> None:
    """An upgrade inside the 7-day window: the occurrence the previous version
    published (its unscoped key) is not published again; the next one is."""
    stream = f"{unique}-events"
    occurrence = schedule.envelope(f"fn-{unique}", "jobs.a", AT)
    await client.set(schedule.legacy_dedup_key(occurrence.occurrence_id), b"1-1", ex=60)
    publisher = RedisOccurrencePublisher(client, stream)
    assert await publisher.publish(occurrence) is None
    assert int(await client.exists(stream)) == 0
    assert await client.exists(schedule.dedup_key(stream, occurrence.occurrence_id)) == 0
    assert await publisher.publish(schedule.envelope(f"fn-{unique}", "jobs.a", AT + 60))
    prefix = schedule.schedule_prefix(f"fn-{unique}", "jobs.a")
    assert await latest_published(client, stream, [prefix]) == {
        prefix: schedule.occurrence_id(f"fn-{unique}", "jobs.a", AT + 60)
    }
