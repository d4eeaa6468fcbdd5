"""The two brokers behind one port: what ``bootstrap`` builds for each.

``redis`` (the default): the consumer group on a Redis stream, its Lua ledger,
the DLQ stream, the ``XPENDING`` backlog, the mover of due delayed events, and
the stream trimmer when
``REDIS_STREAM_RETENTION`` is set. Either broker gets the dead-letter trimmer
when ``DLQ_RETENTION`` is set. ``sqlite``: the embedded broker file, whose
queue, ledger and DLQ table share one database (a claim and its ledger row are
one transaction); retention there deletes acknowledged jobs once their ledger
retention is over, inside the recovery loop's step. Both publish schedule
occurrences if new in one atomic step (a Lua script; one transaction).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import anyio

from relay.adapters.metrics.backlog import redis_backlog_reader
from relay.adapters.metrics.server import Backlog, BacklogReader
from relay.adapters.redis.connection import connect_redis
from relay.adapters.redis.consumers import tidy_consumers
from relay.adapters.redis.dlq_reader import RedisDeadLetterReader
from relay.adapters.redis.ledger import RedisInvocationLedger
from relay.adapters.redis.message_facts import RedisMessageFacts
from relay.adapters.redis.producer import DelayedMover, RedisEventPublisher
from relay.adapters.redis.retention import RetentionTrimmer
from relay.adapters.redis.schedules import RedisOccurrenceHistory, RedisOccurrencePublisher
from relay.adapters.redis.stream import RedisEventStream
from relay.adapters.sqlite.broker.dlq import SqliteDeadLetterReader
from relay.adapters.sqlite.broker.ledger import SqliteInvocationLedger
from relay.adapters.sqlite.broker.message_facts import SqliteMessageFacts
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.schedules import (
    SqliteOccurrenceHistory,
    SqliteOccurrencePublisher,
)
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.application.dlq_retention import DeadLetterRetention
from relay.application.ports import (
    Clock,
    DeadLetterStore,
    DeadLetterTrim,
    EventPublisher,
    EventStream,
    InvocationLedger,
    MessageFactsReader,
    OccurrenceHistory,
    OccurrencePublisher,
)


@dataclass
class Broker:
    """One broker's adapters, ready to compose."""

    name: str  # what `relay health` calls it
    stream: EventStream
    ledger: InvocationLedger
    dead_letters: DeadLetterStore
    backlog: BacklogReader
    # Schedules' publish-if-new and the overlap check (``overlap: skip``).
    publisher: OccurrencePublisher
    history: OccurrenceHistory
    events: EventPublisher  # appends new events (HTTP ingest)
    # What the broker knows about one message (the console's trace page), read-only.
    facts: MessageFactsReader
    loops: list[tuple[str, Callable[..., Coroutine[Any, Any, None]]]] = field(default_factory=list)


async def open_broker(stack: AsyncExitStack, settings: Any, clock: Clock) -> Broker:
    """Open the broker ``settings.broker`` names; closed by ``stack``."""
    if settings.broker.embedded:
        return await _sqlite(stack, settings, clock)
    return await _redis(stack, settings, clock)


def _dlq_retention(broker: Broker, reader: DeadLetterTrim, settings: Any, clock: Clock) -> Broker:
    """``DLQ_RETENTION`` set: the loop that deletes dead letters older than it."""
    retention_ns = getattr(settings, "dlq_retention_ns", None)
    if retention_ns is not None:
        broker.loops.append(("dlq_retention", DeadLetterRetention(reader, retention_ns, clock).run))
    return broker


async def _redis(stack: AsyncExitStack, settings: Any, clock: Clock) -> Broker:
    ttl_s = settings.ledger_retention_ns // 10**9
    redis = await connect_redis(settings.redis.url)
    stack.push_async_callback(_shielded(redis.aclose))
    stream = RedisEventStream(
        redis,
        stream=settings.redis.stream,
        group=settings.redis.group,
        consumer=settings.hostname,
        ledger_ttl_s=ttl_s,
    )
    await stream.ensure_group()
    # Stale consumers of this group (idle, nothing pending) are removed at start.
    await tidy_consumers(
        redis, stream=settings.redis.stream, group=settings.redis.group, keep=settings.hostname
    )
    dead_letters = RedisDeadLetterReader(redis, settings.redis.stream)
    broker = Broker(
        name="redis",
        stream=stream,
        ledger=RedisInvocationLedger(redis, acked_ttl_s=ttl_s),
        dead_letters=dead_letters,
        backlog=redis_backlog_reader(redis, settings.redis.stream, settings.redis.group),
        publisher=RedisOccurrencePublisher(redis, settings.redis.stream),
        history=RedisOccurrenceHistory(redis, settings.redis.stream, settings.redis.group),
        events=RedisEventPublisher(
            redis, settings.redis.stream, dedup_window_ns=settings.publish_dedup_window_ns
        ),
        facts=RedisMessageFacts(redis, settings.redis.stream, settings.redis.group),
    )
    # Every worker moves the stream's due delayed events (each exactly once).
    broker.loops.append(("delayed", DelayedMover(redis, settings.redis.stream).run))
    if settings.stream_retention_ns is not None:
        trimmer = RetentionTrimmer(
            redis, settings.redis.stream, settings.stream_retention_ns, clock
        )
        broker.loops.append(("retention", trimmer.run))
    return _dlq_retention(broker, dead_letters, settings, clock)


async def _sqlite(stack: AsyncExitStack, settings: Any, clock: Clock) -> Broker:
    store = await anyio.to_thread.run_sync(BrokerStore, settings.broker.path, clock)

    async def close() -> None:  # joins the writer thread: not on the event loop
        await anyio.to_thread.run_sync(store.close)

    stack.push_async_callback(_shielded(close))
    stream = SqliteEventStream(
        store,
        stream=settings.redis.stream,
        group=settings.redis.group,
        consumer=settings.hostname,
    )
    await stream.ensure_group()
    dead_letters = SqliteDeadLetterReader(store)
    broker = Broker(
        name="broker",
        stream=stream,
        ledger=SqliteInvocationLedger(store, acked_ttl_s=settings.ledger_retention_ns // 10**9),
        dead_letters=dead_letters,
        backlog=sqlite_backlog_reader(store, settings.redis.stream),
        publisher=SqliteOccurrencePublisher(store, settings.redis.stream),
        history=SqliteOccurrenceHistory(store, settings.redis.stream),
        events=SqliteEventPublisher(
            store, settings.redis.stream, dedup_window_ns=settings.publish_dedup_window_ns
        ),
        facts=SqliteMessageFacts(store, settings.redis.stream, settings.redis.group),
    )
    return _dlq_retention(broker, dead_letters, settings, clock)


def sqlite_backlog_reader(store: BrokerStore, stream: str) -> BacklogReader:
    """``() -> (jobs ready or leased and not yet acknowledged, age s of the oldest
    since it was ready, delayed jobs not due yet)``."""

    async def read() -> Backlog:
        now = store.now_ms()
        count, oldest, delayed = await store.read(
            lambda c: c.execute(
                "SELECT count(*), min(at), (SELECT count(*) FROM jobs INDEXED BY jobs_delayed"
                "  WHERE stream = ? AND state = 'ready' AND ready_ms > ?) FROM ("
                " SELECT created_ms AS at FROM jobs"
                "  WHERE stream = ? AND state = 'ready' AND ready_ms IS NULL"
                " UNION ALL SELECT ready_ms FROM jobs"
                "  WHERE stream = ? AND state = 'ready' AND ready_ms <= ?"
                " UNION ALL SELECT coalesce(ready_ms, created_ms) FROM jobs"
                "  WHERE stream = ? AND state = 'leased')",
                (stream, now, stream, stream, now, stream),
            ).fetchone()
        )
        if not count:
            return Backlog(0, 0.0, int(delayed))
        return Backlog(int(count), max(0.0, (now - int(oldest)) / 1000), int(delayed))

    return read


def _shielded(close: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(20.0):
            await close()

    return run
