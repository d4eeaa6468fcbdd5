"""``MessageFactsReader`` on the embedded broker: the same facts as on Redis,
read from the file in one read transaction (``relay trace``)."""

from __future__ import annotations

import sqlite3

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.domain.errors import ConfigError
from relay.domain.message_facts import NO_EXPIRY_TTL, NO_KEY_TTL, DeadLetterFact, MessageFacts

_DLQ_FIELDS = (
    "original_stream", "original_id", "group", "consumer", "event", "reason", "function",
    "handler", "deliveries", "handler_attempts", "timestamp",
)


async def sqlite_target_problem(store: BrokerStore, stream: str) -> str | None:
    """The embedded broker has one group per file, so only the stream can be wrong:
    a file that holds jobs or dead letters of other streams only."""

    def streams(c: sqlite3.Connection) -> list[str]:
        # the usual answer (the stream is there) is one index lookup; the list of
        # what the file holds is only read for the error line
        if c.execute("SELECT 1 FROM jobs WHERE stream = ? LIMIT 1", (stream,)).fetchone():
            return []
        rows = c.execute(
            "SELECT stream FROM jobs UNION SELECT original_stream FROM dlq ORDER BY 1 LIMIT 20"
        ).fetchall()
        return [str(r[0]) for r in rows]

    found = await store.read(streams)
    if not found or stream in found:
        return None
    return (
        f"stream {stream!r} has no entries in the broker file {store.path} "
        f"(REDIS_STREAM names it; the file holds: {', '.join(found)})"
    )


class SqliteMessageFacts:
    """The facts of one stream's messages in the broker file (one group per file)."""

    def __init__(self, store: BrokerStore, stream: str, group: str) -> None:
        self._store = store
        self._stream = stream
        self._group = group

    async def facts(self, message_id: str) -> MessageFacts:
        """Every fact about ``message_id``; ``ConfigError`` when the file holds no
        entry of the stream."""
        problem = await sqlite_target_problem(self._store, self._stream)
        if problem is not None:
            raise ConfigError(problem)
        now_ms = self._store.now_ms()
        return await self._store.read(lambda c: self._query(c, message_id, now_ms))

    def _query(self, c: sqlite3.Connection, message_id: str, now_ms: int) -> MessageFacts:
        seq = jobs.seq_of(message_id)
        facts = MessageFacts(message_id, self._stream, self._group, now_ms)
        row = c.execute(
            "SELECT created_ms, payload, state, consumer, leased_ms, deliveries, expires_ms,"
            " ready_ms FROM jobs WHERE seq = ?",
            (seq,),
        ).fetchone()
        if row is None or jobs.message_id(row[0], seq or 0) != message_id:
            return facts
        _, payload, state, consumer, leased_ms, deliveries, expires_ms, ready_ms = row
        facts.body_bytes = len(payload or b"")
        if state == "ready" and ready_ms is not None and ready_ms > now_ms:
            facts.delayed_until_ms = ready_ms
        facts.ledger = dict(
            c.execute("SELECT field, value FROM ledger WHERE seq = ?", (seq,)).fetchall()
        )
        if state == "acked":
            facts.ledger_ttl_s = max(0, (expires_ms - now_ms) // 1000)
        else:
            facts.ledger_ttl_s = NO_EXPIRY_TTL if facts.ledger else NO_KEY_TTL
        if state == "leased":
            facts.pending = {
                "consumer": consumer,
                "idle_ms": max(0, now_ms - leased_ms),
                "deliveries": deliveries,
            }
        facts.dead_letters = _dead_letters(c, message_id)
        return facts


def _dead_letters(c: sqlite3.Connection, message_id: str) -> list[DeadLetterFact]:
    rows = c.execute(
        "SELECT created_ms, seq, original_stream, original_id, grp, consumer, event, reason,"
        " function, handler, deliveries, handler_attempts, timestamp FROM dlq"
        " WHERE original_id = ? ORDER BY seq",
        (message_id,),
    ).fetchall()
    return [
        DeadLetterFact(
            jobs.message_id(r[0], r[1]),
            {n: str(v) for n, v in zip(_DLQ_FIELDS, r[2:], strict=True)},
        )
        for r in rows
    ]
