"""The OccurrencePublisher and OccurrenceHistory contract, on the in-memory fakes, on
Redis and on the embedded broker's file: one suite, the same tests for all three."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio

from relay.adapters.redis.keys import invocation_key
from relay.adapters.redis.schedules import RedisOccurrenceHistory, RedisOccurrencePublisher
from relay.adapters.redis.stream import RedisEventStream
from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.schedules import (
    SqliteOccurrenceHistory,
    SqliteOccurrencePublisher,
)
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.application.ports import EventStream, OccurrenceHistory, OccurrencePublisher
from relay.domain import schedule
from relay.domain.ledger_rules import CLASS_FIELD, class_stamp
from relay.domain.outcome import StreamMessage
from tests.contract.conftest import redis_url_for
from tests.fakes import (
    FakeClock,
    InMemoryDeadLetterQueue,
    InMemoryEventStream,
    InMemoryLedger,
    InMemoryOccurrenceHistory,
    InMemoryOccurrencePublisher,
)

pytestmark = pytest.mark.anyio

AT = 1_900_000_000  # 2030-03-17T17:46:40Z


class Bed:
    publisher: OccurrencePublisher
    history: OccurrenceHistory
    stream: EventStream

    async def entries(self) -> list[bytes | None]:
        raise NotImplementedError

    async def classify(self, message_id: str, classification: str) -> None:
        raise NotImplementedError

    async def record_previous_layout(self, occurrence_id: str) -> None:
        """A live dedup record of the layout before records were stream-scoped."""
        pytest.skip("the in-memory publisher has no previous layout")


class MemoryBed(Bed):
    def __init__(self) -> None:
        clock = FakeClock()
        self.memory_stream = InMemoryEventStream(clock)
        self.ledger = InMemoryLedger(self.memory_stream, InMemoryDeadLetterQueue(), clock)
        self.stream = self.memory_stream
        self.publisher = InMemoryOccurrencePublisher(self.memory_stream, clock)
        self.history = InMemoryOccurrenceHistory(self.memory_stream, self.ledger, self.publisher)

    async def entries(self) -> list[bytes | None]:
        return list(self.memory_stream.entries.values())

    async def classify(self, message_id: str, classification: str) -> None:
        self.ledger.hashes.setdefault(message_id, {})[CLASS_FIELD] = class_stamp(
            classification, "t1"
        )


class RedisBed(Bed):
    def __init__(self, client: redis.asyncio.Redis, unique: str) -> None:
        self.client = client
        name = f"{unique}-events"
        self.stream = RedisEventStream(client, stream=name, group="relay", consumer="w1")
        self.publisher = RedisOccurrencePublisher(client, name)
        self.history = RedisOccurrenceHistory(client, name, "relay")

    async def entries(self) -> list[bytes | None]:
        rows: Any = await self.client.xrange(self.stream.stream)
        return [fields.get(b"event") for _, fields in rows]

    async def classify(self, message_id: str, classification: str) -> None:
        key = invocation_key(self.stream.stream, self.stream.group, message_id)
        await self.client.hset(key, CLASS_FIELD, class_stamp(classification, "t1"))

    async def record_previous_layout(self, occurrence_id: str) -> None:
        await self.client.set(schedule.legacy_dedup_key(occurrence_id), b"1", ex=60)


class _AcknowledgingStream(SqliteEventStream):
    """The broker file's stream, where ``drop`` (the suite's "no longer pending")
    is the fenced acknowledgment a settled invocation makes: the embedded broker's
    own ``drop`` does nothing, a job's body never being gone before it is acked."""

    def __init__(self, store: BrokerStore) -> None:
        super().__init__(store, stream="events", group="relay", consumer="w1")
        self._own = store
        self._handles: dict[int, str] = {}  # what a worker keeps: each delivery's handle

    async def read(
        self, count: int, block_ms: int, patience_s: float = 10.0
    ) -> Sequence[StreamMessage]:
        got = await super().read(count, block_ms, patience_s)
        self._handles.update((jobs.seq_of(m.id) or 0, m.delivery) for m in got)
        return got

    async def drop(self, ids: Sequence[str]) -> None:
        for message_id in ids:
            seq = jobs.seq_of(message_id)
            assert seq is not None
            token = self._handles.pop(seq)

            def ack(c: sqlite3.Connection, now: int, s: int = seq, t: str = token) -> bool:
                jobs.hold(c, now, "w1", [(s, t)])  # a read only peeks: the begin leases
                return jobs.acknowledge(c, now, s, t, 60)

            assert await self._own.write(ack)


class SqliteBed(Bed):
    def __init__(self, store: BrokerStore) -> None:
        self.store = store
        self.stream = _AcknowledgingStream(store)
        self.publisher = SqliteOccurrencePublisher(store, "events")
        self.history = SqliteOccurrenceHistory(store, "events")

    async def entries(self) -> list[bytes | None]:
        rows = await self.store.read(
            lambda c: c.execute("SELECT payload FROM jobs ORDER BY seq").fetchall()
        )
        return [bytes(r[0]) if r[0] is not None else None for r in rows]

    async def classify(self, message_id: str, classification: str) -> None:
        seq = jobs.seq_of(message_id)
        stamp = class_stamp(classification, "t1")

        def step(c: sqlite3.Connection, _now: int) -> None:
            c.execute(
                "INSERT INTO ledger (seq, field, value) VALUES (?, ?, ?)", (seq, CLASS_FIELD, stamp)
            )

        await self.store.write(step)

    async def record_previous_layout(self, occurrence_id: str) -> None:
        def step(c: sqlite3.Connection, now: int) -> None:
            c.execute(
                "INSERT INTO occurrences (id, message_id, expires_ms) VALUES (?, ?, ?)",
                (occurrence_id, "1-1", now + 60_000),
            )

        await self.store.write(step)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis), "sqlite"])
async def bed(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Bed]:
    if request.param == "memory":
        yield MemoryBed()
        return
    if request.param == "sqlite":
        store = await anyio.to_thread.run_sync(
            BrokerStore, tmp_path / "broker.sqlite3", FakeClock()
        )
        try:
            yield SqliteBed(store)
        finally:
            await anyio.to_thread.run_sync(store.close)
        return
    unique: str = request.getfixturevalue("unique")
    client = redis.asyncio.Redis.from_url(redis_url_for(request), decode_responses=False)
    try:
        b = RedisBed(client, unique)
        await b.stream.ensure_group()
        yield b
    finally:
        await client.aclose()


def _fn(request: pytest.FixtureRequest) -> str:
    # dedup keys are global to the server: a name of this test's own
    name: str = request.node.name
    return "fn-" + name.replace("[", "-").replace("]", "")


async def test_publish_appends_the_envelope_once(bed: Bed, request: pytest.FixtureRequest) -> None:
    occurrence = schedule.envelope(_fn(request), "jobs.tick.handler", AT)
    first = await bed.publisher.publish(occurrence)
    second = await bed.publisher.publish(occurrence)
    assert first is not None
    assert second is None
    assert await bed.entries() == [schedule.encode(occurrence)]


async def test_distinct_instants_are_distinct_occurrences(
    bed: Bed, request: pytest.FixtureRequest
) -> None:
    fn = _fn(request)
    ids = [await bed.publisher.publish(schedule.envelope(fn, "jobs.a", AT + i)) for i in range(3)]
    assert None not in ids
    assert len(set(ids)) == 3
    assert len(await bed.entries()) == 3


async def test_published_as_names_the_entry_publish_if_new_appended(
    bed: Bed, request: pytest.FixtureRequest
) -> None:
    """Issue 35.12: what tells a published occurrence from a copy of it."""
    fn = _fn(request)
    occurrence = schedule.envelope(fn, "jobs.a", AT)
    assert await bed.history.published_as(occurrence.occurrence_id) is None
    added = await bed.publisher.publish(occurrence)
    assert added is not None
    assert await bed.history.published_as(occurrence.occurrence_id) == added
    assert await bed.publisher.publish(occurrence) is None  # refused: the record stands
    assert await bed.history.published_as(occurrence.occurrence_id) == added
    other = schedule.occurrence_id(fn, "jobs.a", AT + 60)
    assert await bed.history.published_as(other) is None


async def test_a_record_of_the_previous_layout_names_no_entry(
    bed: Bed, request: pytest.FixtureRequest
) -> None:
    """An upgrade inside the 7-day window: the old record counts as "this one"."""
    occurrence_id = schedule.occurrence_id(_fn(request), "jobs.a", AT)
    await bed.record_previous_layout(occurrence_id)
    assert await bed.history.published_as(occurrence_id) == ""
    assert not schedule.is_copy(await bed.history.published_as(occurrence_id), "9-9")


async def test_unfinished_before_sees_an_earlier_pending_occurrence(
    bed: Bed, request: pytest.FixtureRequest
) -> None:
    fn = _fn(request)
    prefix = schedule.schedule_prefix(fn, "jobs.a")
    await bed.publisher.publish(schedule.envelope(fn, "jobs.a", AT))
    await bed.publisher.publish(schedule.envelope(fn, "jobs.b", AT))  # another schedule
    await bed.publisher.publish(schedule.envelope(fn, "jobs.a", AT + 60))
    first, other, second = await bed.stream.read(10, 10)
    # not classified yet: the entry's envelope says what it is
    assert await bed.history.unfinished_before(prefix, second.id)
    assert not await bed.history.unfinished_before(prefix, first.id)
    await bed.classify(first.id, schedule.occurrence_id(fn, "jobs.a", AT))
    await bed.classify(other.id, schedule.occurrence_id(fn, "jobs.b", AT))
    assert await bed.history.unfinished_before(prefix, second.id)
    other_prefix = schedule.schedule_prefix(fn, "jobs.b")
    assert not await bed.history.unfinished_before(other_prefix, other.id)


async def test_an_acknowledged_occurrence_is_finished(
    bed: Bed, request: pytest.FixtureRequest
) -> None:
    fn = _fn(request)
    prefix = schedule.schedule_prefix(fn, "jobs.a")
    await bed.publisher.publish(schedule.envelope(fn, "jobs.a", AT))
    await bed.publisher.publish(schedule.envelope(fn, "jobs.a", AT + 60))
    first, second = await bed.stream.read(10, 10)
    await bed.stream.drop([first.id])  # acknowledged: no longer pending
    assert not await bed.history.unfinished_before(prefix, second.id)


@pytest.mark.redis
async def test_the_redis_check_pages_past_many_pending_events(
    request: pytest.FixtureRequest, unique: str
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url_for(request), decode_responses=False)
    try:
        bed = RedisBed(client, unique)
        await bed.stream.ensure_group()
        fn = f"fn-{unique}"
        prefix = schedule.schedule_prefix(fn, "jobs.a")
        for i in range(1200):  # more than two pages of ordinary events, pending first
            await client.xadd(bed.stream.stream, {"event": b'{"n": %d}' % i})
        await bed.publisher.publish(schedule.envelope(fn, "jobs.a", AT))
        await bed.publisher.publish(schedule.envelope(fn, "jobs.a", AT + 60))
        delivered = await bed.stream.read(2000, 10)
        assert len(delivered) == 1202
        assert await bed.history.unfinished_before(prefix, delivered[-1].id)
        assert not await bed.history.unfinished_before(prefix, delivered[-2].id)
    finally:
        await client.aclose()
