"""Retention against a real Redis: trimming never removes what a group still needs.

The test bed's Redis is 7.x (no ``XTRIM ... ACKED``), so these exercise the
clamping path for real; the ACKED command shape is covered in
``tests/unit/test_retention_trimmer.py``. Entries use explicit ids far in the
past and a fake clock, and trims are exact (``approximate=False``) so that the
result does not depend on how Redis packs entries into nodes.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from relay.adapters.redis.retention import RetentionTrimmer
from relay.domain.durations import parse_duration
from relay.domain.retention import StreamId
from tests.fakes import FakeClock

pytestmark = [pytest.mark.redis, pytest.mark.anyio]

# "now" is 1,000,000 ms after the epoch and the window is 1s: the window cutoff is
# 999000-0, above every seeded old id and below the fresh one.
NOW_S = 1000.0
RETENTION = parse_duration("1s")
OLD_IDS = [f"{ms}-0" for ms in range(1, 11)]
FRESH_ID = "999999-0"


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Redis]:
    redis = Redis.from_url(redis_url, decode_responses=True)
    yield redis
    await redis.aclose()


@pytest.fixture
async def stream(client: Redis) -> AsyncIterator[str]:
    name = f"test:retention:{uuid.uuid4().hex}"
    for entry_id in [*OLD_IDS, FRESH_ID]:
        await client.xadd(name, {"event": "{}"}, id=entry_id)
    yield name
    await client.delete(name)


def trimmer(client: Redis, stream: str) -> RetentionTrimmer:
    return RetentionTrimmer(client, stream, RETENTION, FakeClock(now=NOW_S), approximate=False)


async def ids(client: Redis, stream: str) -> list[str]:
    entries: Any = await client.xrange(stream)
    return [entry_id for entry_id, _ in entries]


async def deliver(client: Redis, stream: str, group: str, count: int) -> list[str]:
    """Deliver up to ``count`` new entries to ``group``; their ids."""
    reply: Any = await client.xreadgroup(group, "c1", {stream: ">"}, count=count)
    return [entry_id for entry_id, _ in reply[0][1]] if reply else []


async def read_and_ack(client: Redis, stream: str, group: str, count: int, keep: set[str]) -> None:
    """Deliver ``count`` entries to ``group`` and acknowledge all but ``keep``."""
    delivered = await deliver(client, stream, group, count)
    to_ack = [entry_id for entry_id in delivered if entry_id not in keep]
    if to_ack:
        await client.xack(stream, group, *to_ack)


async def test_redis_7_has_no_acked_trim_so_the_cutoff_is_clamped(
    client: Redis, stream: str
) -> None:
    version = (await client.info("server"))["redis_version"]
    major, minor = (int(part) for part in version.split(".")[:2])
    if (major, minor) >= (8, 2):
        pytest.skip("server supports XTRIM ... ACKED")
    trim = trimmer(client, stream)
    assert await trim.supports_acked() is False
    outcome = await trim.trim_once()
    assert outcome.mode == "clamped"


async def test_acked_old_entries_are_trimmed_and_fresh_ones_stay(
    client: Redis, stream: str
) -> None:
    await client.xgroup_create(stream, "g", id="0")
    await read_and_ack(client, stream, "g", count=100, keep=set())
    outcome = await trimmer(client, stream).trim_once()
    assert outcome.removed == len(OLD_IDS)
    assert outcome.effective == StreamId(999_000, 0)
    assert await ids(client, stream) == [FRESH_ID]


async def test_pending_entry_older_than_the_window_survives(client: Redis, stream: str) -> None:
    await client.xgroup_create(stream, "g", id="0")
    await read_and_ack(client, stream, "g", count=100, keep={"3-0"})
    outcome = await trimmer(client, stream).trim_once()
    assert outcome.effective == StreamId(3, 0)
    assert outcome.limited_by == "g"
    remaining = await ids(client, stream)
    assert "3-0" in remaining
    assert remaining[0] == "3-0"  # the acknowledged entries before it went
    pending = await client.xpending(stream, "g")
    assert pending["pending"] == 1


async def test_undelivered_entries_of_a_second_group_survive(client: Redis, stream: str) -> None:
    await client.xgroup_create(stream, "fast", id="0")
    await client.xgroup_create(stream, "slow", id="0")
    await read_and_ack(client, stream, "fast", count=100, keep=set())
    await read_and_ack(client, stream, "slow", count=4, keep=set())
    outcome = await trimmer(client, stream).trim_once()
    assert outcome.limited_by == "slow"
    assert await ids(client, stream) == [*OLD_IDS[4:], FRESH_ID]
    # and the slow group can still read every entry it has not seen
    assert await deliver(client, stream, "slow", 100) == [*OLD_IDS[4:], FRESH_ID]


async def test_a_new_group_at_zero_keeps_the_whole_stream(client: Redis, stream: str) -> None:
    await client.xgroup_create(stream, "g", id="0")
    outcome = await trimmer(client, stream).trim_once()
    assert outcome.removed == 0
    assert await ids(client, stream) == [*OLD_IDS, FRESH_ID]


async def test_a_missing_stream_is_not_an_error(client: Redis) -> None:
    outcome = await trimmer(client, f"test:retention:{uuid.uuid4().hex}").trim_once()
    assert outcome.removed == 0


async def test_approximate_trim_removes_whole_nodes_and_keeps_the_pending_one(
    client: Redis,
) -> None:
    """The production form (``MINID ~``): whole old nodes go, the pending entry stays."""
    name = f"test:retention:{uuid.uuid4().hex}"
    old = [f"{ms}-0" for ms in range(1, 351)]
    pipe = client.pipeline(transaction=False)
    for entry_id in old:
        pipe.xadd(name, {"event": "{}"}, id=entry_id)
    await pipe.execute()
    try:
        await client.xgroup_create(name, "g", id="0")
        await read_and_ack(client, name, "g", count=1000, keep={"250-0"})
        trim = RetentionTrimmer(client, name, RETENTION, FakeClock(now=NOW_S))
        outcome = await trim.trim_once()
        assert outcome.effective == StreamId(250, 0)
        remaining = await ids(client, name)
        assert "250-0" in remaining
        assert outcome.removed > 0
        assert len(remaining) == len(old) - outcome.removed
    finally:
        await client.delete(name)
