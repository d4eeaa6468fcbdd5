"""The delivery contract harness: the same tests against the in-memory fakes and Redis."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from relay.adapters.redis.keys import dlq_key, invocation_key
from relay.adapters.redis.ledger import RedisInvocationLedger
from relay.adapters.redis.stream import RedisEventStream
from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.ledger import SqliteInvocationLedger
from relay.adapters.sqlite.broker.store import BrokerStore, connect
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.adapters.system import SystemClock
from relay.application.ports import EventStream, InvocationLedger
from relay.domain.outcome import MessageContext, StreamMessage
from tests.fakes import FakeClock, InMemoryDeadLetterQueue, InMemoryEventStream, InMemoryLedger


class Harness:
    """A stream + ledger + DLQ under test, with the inspection the tests need."""

    stream: EventStream
    ledger: InvocationLedger
    # The handle of each message's last delivery (``StreamMessage.delivery``), as a
    # worker keeps its messages: the ledger's calls carry it on their context.
    handles: dict[str, str]

    def ctx(self, message_id: str, consumer: str | None = None) -> MessageContext:
        return MessageContext(
            stream=self.stream.stream,
            group=self.stream.group,
            consumer=consumer or self.stream.consumer,
            message_id=message_id,
            timestamp="2027-01-15T08:00:00.000Z",
            delivery=self.handles.get(message_id, ""),
        )

    async def add(self, payload: bytes | None) -> str:
        raise NotImplementedError

    async def hash(self, message_id: str) -> dict[str, str]:
        raise NotImplementedError

    async def set_field(self, message_id: str, field: str, value: str) -> None:
        raise NotImplementedError

    async def ttl(self, message_id: str) -> int:
        raise NotImplementedError

    async def pending(self) -> set[str]:
        raise NotImplementedError

    async def dlq(self) -> list[dict[str, str]]:
        raise NotImplementedError

    async def break_dlq(self) -> None:
        raise NotImplementedError

    async def repair_dlq(self) -> None:
        raise NotImplementedError

    async def deliver(self, payload: bytes | None = b'{"a": 1}') -> StreamMessage:
        await self.add(payload)
        [message] = await self.stream.read(1, 10)
        self.handles[message.id] = message.delivery
        return message


class MemoryHarness(Harness):
    def __init__(self) -> None:
        self.handles = {}
        self.clock = FakeClock()
        self.memory_stream = InMemoryEventStream(self.clock)
        self.memory_dlq = InMemoryDeadLetterQueue()
        self.memory_ledger = InMemoryLedger(self.memory_stream, self.memory_dlq, self.clock)
        self.stream = self.memory_stream
        self.ledger = self.memory_ledger

    async def add(self, payload: bytes | None) -> str:
        return self.memory_stream.add(payload)

    async def hash(self, message_id: str) -> dict[str, str]:
        return dict(self.memory_ledger.hashes.get(message_id, {}))

    async def set_field(self, message_id: str, field: str, value: str) -> None:
        self.memory_ledger.hashes.setdefault(message_id, {})[field] = value

    async def ttl(self, message_id: str) -> int:
        return self.memory_ledger.ttl.get(message_id, -1)

    async def pending(self) -> set[str]:
        return set(self.memory_stream.pending)

    async def dlq(self) -> list[dict[str, str]]:
        return [entry.fields() for _, entry in self.memory_dlq.entries]

    async def break_dlq(self) -> None:
        self.memory_dlq.broken = True

    async def repair_dlq(self) -> None:
        self.memory_dlq.broken = False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisHarness(Harness):
    def __init__(self, client: redis.asyncio.Redis, unique: str) -> None:
        self.handles = {}
        self.client = client
        self.redis_stream = RedisEventStream(
            client, stream=f"{unique}-events", group="relay", consumer="worker-1"
        )
        self.stream = self.redis_stream
        self.ledger = RedisInvocationLedger(client)

    def _key(self, message_id: str) -> str:
        return invocation_key(self.stream.stream, self.stream.group, message_id)

    async def add(self, payload: bytes | None) -> str:
        fields = {"event": payload} if payload is not None else {"other": b"x"}
        return _text(await self.client.xadd(self.stream.stream, fields))  # type: ignore[arg-type]

    async def hash(self, message_id: str) -> dict[str, str]:
        raw = await self.client.hgetall(self._key(message_id))
        return {_text(k): _text(v) for k, v in raw.items()}

    async def set_field(self, message_id: str, field: str, value: str) -> None:
        await self.client.hset(self._key(message_id), field, value)

    async def ttl(self, message_id: str) -> int:
        return int(await self.client.ttl(self._key(message_id)))

    async def pending(self) -> set[str]:
        rows = await self.client.xpending_range(
            self.stream.stream, self.stream.group, min="-", max="+", count=1000
        )
        return {_text(r["message_id"]) for r in rows}

    async def dlq(self) -> list[dict[str, str]]:
        rows: Any = await self.client.xrange(dlq_key(self.stream.stream))
        return [{_text(k): _text(v) for k, v in fields.items()} for _, fields in rows]

    async def break_dlq(self) -> None:
        await self.client.set(dlq_key(self.stream.stream), "not a stream")

    async def repair_dlq(self) -> None:
        await self.client.delete(dlq_key(self.stream.stream))


class SqliteHarness(Harness):
    """The embedded broker on a fresh file; inspection reads the file directly."""

    def __init__(self, path: Path) -> None:
        self.handles = {}
        self.store = BrokerStore(path, SystemClock())
        self.sqlite_stream = SqliteEventStream(
            self.store, stream="events", group="relay", consumer="worker-1"
        )
        self.stream = self.sqlite_stream
        self.ledger = SqliteInvocationLedger(self.store)
        self._path = path

    def _query(self, sql: str, *args: Any) -> list[Any]:
        conn = connect(self._path)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def _seq(self, message_id: str) -> int:
        seq = jobs.seq_of(message_id)
        assert seq is not None
        return seq

    async def add(self, payload: bytes | None) -> str:
        return await self.store.write(
            lambda c, now: jobs.publish(c, now, "events", payload, 2), wakes=True
        )

    async def hash(self, message_id: str) -> dict[str, str]:
        rows = self._query("SELECT field, value FROM ledger WHERE seq = ?", self._seq(message_id))
        return dict(rows)

    async def set_field(self, message_id: str, field: str, value: str) -> None:
        seq = self._seq(message_id)
        await self.store.write(
            lambda c, _: c.execute(
                "INSERT OR REPLACE INTO ledger (seq, field, value) VALUES (?, ?, ?)",
                (seq, field, value),
            )
        )

    async def ttl(self, message_id: str) -> int:
        [(state, expires)] = self._query(
            "SELECT state, expires_ms FROM jobs WHERE seq = ?", self._seq(message_id)
        )
        if state != "acked":
            return -1
        return int((expires - self.store.now_ms()) // 1000)

    async def pending(self) -> set[str]:
        rows = self._query("SELECT created_ms, seq FROM jobs WHERE state = 'leased'")
        return {jobs.message_id(created, seq) for created, seq in rows}

    async def dlq(self) -> list[dict[str, str]]:
        rows = self._query(
            "SELECT original_stream, original_id, grp, consumer, event, reason, function,"
            " handler, deliveries, handler_attempts, timestamp FROM dlq ORDER BY seq"
        )
        names = ("original_stream", "original_id", "group", "consumer", "event", "reason",
                 "function", "handler", "deliveries", "handler_attempts", "timestamp")
        return [{n: str(v) for n, v in zip(names, row, strict=True)} for row in rows]

    async def break_dlq(self) -> None:
        # What a full disk or a read-only table would do to the insert, and nothing else.
        await self.store.write(lambda c, _: c.execute(
            "CREATE TRIGGER dlq_broken BEFORE INSERT ON dlq"
            " BEGIN SELECT RAISE(ABORT, 'dead-letter table refuses writes'); END"
        ))

    async def repair_dlq(self) -> None:
        await self.store.write(lambda c, _: c.execute("DROP TRIGGER IF EXISTS dlq_broken"))


def redis_url_for(request: pytest.FixtureRequest) -> str:
    """The session Redis; ``RELAY_DEV_REDIS_URL`` points at a private server instead
    (developing without the container test bed)."""
    override = os.environ.get("RELAY_DEV_REDIS_URL")
    return override or str(request.getfixturevalue("redis_url"))


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis), "sqlite"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    if request.param == "memory":
        yield MemoryHarness()
        return
    if request.param == "sqlite":
        sqlite_harness = SqliteHarness(tmp_path / "broker.sqlite3")
        try:
            yield sqlite_harness
        finally:
            sqlite_harness.store.close()
        return
    url = redis_url_for(request)
    unique: str = request.getfixturevalue("unique")
    client = redis.asyncio.Redis.from_url(url, decode_responses=False)
    try:
        h = RedisHarness(client, unique)
        await h.stream.ensure_group()
        yield h
    finally:
        await client.aclose()
