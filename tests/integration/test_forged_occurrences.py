"""Issue 35.12 on the real brokers: an occurrence runs only if it is the entry
publish-if-new appended for it. A copy published by hand (same occurrence id,
another message id) is acknowledged as ``forged``, never run, never dead-lettered;
the published one runs. A record of the previous layout names no entry, so an
envelope delivered across an upgrade still runs (failure rows 216-219)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio

from relay.domain import events as ev
from relay.domain import schedule
from relay.domain.commands import DispatchMessage
from relay.domain.message_outcomes import Ended
from tests.integration.broker_world import BrokerWorld
from tests.integration.delivery_support import RedisWorld, bytes_client

pytestmark = pytest.mark.anyio

HANDLER = "jobs.tick"
EVERY_MINUTE = {"handler": HANDLER, "cron": "* * * * *"}


def last_minute() -> int:
    """A real firing of ``EVERY_MINUTE``, well inside the 7-day window."""
    return int(time.time()) // 60 * 60 - 60


@pytest.fixture
async def bytes_redis(request: pytest.FixtureRequest) -> Any:
    async with bytes_client(request) as client:
        yield client


@pytest.mark.redis
async def test_redis_a_copy_does_not_run_and_the_published_one_does(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    world = RedisWorld(bytes_redis, unique)
    fn = f"fn-{unique}"
    world.function(fn, {"schedules": [EVERY_MINUTE]})
    await world.stream.ensure_group()
    occurrence = schedule.envelope(fn, HANDLER, last_minute())
    published = await world.occurrences.publish(occurrence)
    copy = await world.add(schedule.encode(occurrence))
    original, copied = await world.stream.read(2, 10)
    assert (original.id, copied.id) == (published, copy)
    report = await world.dispatch(copied)
    assert (report.acknowledged, report.outcome) == (True, Ended.FORGED)
    assert world.runtime.requests == []
    assert await world.dlq() == []
    assert [e.message_id for e in world.events if isinstance(e, ev.OccurrenceForged)] == [copy]
    report = await world.dispatch(original)
    assert (report.acknowledged, report.outcome) == (True, "completed")
    assert [(r.function, r.handler) for r in world.runtime.requests] == [(fn, HANDLER)]
    assert await world.pending() == set()


@pytest.mark.redis
async def test_redis_a_record_of_the_previous_layout_lets_the_envelope_run(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    """Published by a worker of the previous release (``relay:schedule:...``, its
    value no entry id) and delivered by this one: it runs, never ``forged``."""
    world = RedisWorld(bytes_redis, unique)
    fn = f"fn-{unique}"
    world.function(fn, {"schedules": [EVERY_MINUTE]})
    await world.stream.ensure_group()
    occurrence = schedule.envelope(fn, HANDLER, last_minute())
    await bytes_redis.set(schedule.legacy_dedup_key(occurrence.occurrence_id), b"1", ex=60)
    await world.add(schedule.encode(occurrence))
    [message] = await world.stream.read(1, 10)
    report = await world.dispatch(message)
    assert (report.acknowledged, report.outcome) == (True, "completed")
    assert len(world.runtime.requests) == 1


async def test_sqlite_a_copy_does_not_run_and_the_published_one_does(tmp_path: Path) -> None:
    world = await anyio.to_thread.run_sync(
        lambda: BrokerWorld(tmp_path / "broker.sqlite3", template={"schedules": [EVERY_MINUTE]})
    )
    try:
        occurrence = schedule.envelope("fn", HANDLER, last_minute())
        [copy] = await world.publisher.publish([(schedule.encode(occurrence), None)])
        published = await world.occurrences.publish(occurrence)  # the copy came first
        copied, original = await world.stream.read(2, 10)
        assert (copied.id, original.id) == (copy, published)
        report = await world.bus.send(DispatchMessage(message=copied))
        assert (report.acknowledged, report.outcome) == (True, Ended.FORGED)
        assert world.runtime.requests == []
        report = await world.bus.send(DispatchMessage(message=original))
        assert (report.acknowledged, report.outcome) == (True, "completed")
        assert [(r.function, r.handler) for r in world.runtime.requests] == [("fn", HANDLER)]
    finally:
        await anyio.to_thread.run_sync(world.close)


async def test_sqlite_a_row_of_the_previous_layout_lets_the_envelope_run(tmp_path: Path) -> None:
    world = await anyio.to_thread.run_sync(
        lambda: BrokerWorld(tmp_path / "broker.sqlite3", template={"schedules": [EVERY_MINUTE]})
    )
    try:
        occurrence = schedule.envelope("fn", HANDLER, last_minute())
        oid = occurrence.occurrence_id
        await world.store.write(
            lambda c, now: c.execute(
                "INSERT INTO occurrences (id, message_id, expires_ms) VALUES (?, ?, ?)",
                (oid, "1-1", now + 60_000),
            )
        )
        await world.publisher.publish([(schedule.encode(occurrence), None)])
        [message] = await world.stream.read(1, 10)
        report = await world.bus.send(DispatchMessage(message=message))
        assert (report.acknowledged, report.outcome) == (True, "completed")
        assert len(world.runtime.requests) == 1
    finally:
        await anyio.to_thread.run_sync(world.close)
