"""``relay trace`` on the embedded broker: the same facts, read from the file."""

from __future__ import annotations

import sqlite3

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.entrypoints.cli.trace import DeadLetter, MessageFacts

_DLQ_FIELDS = (
    "original_stream", "original_id", "group", "consumer", "event", "reason", "function",
    "handler", "deliveries", "handler_attempts", "timestamp",
)


async def gather_sqlite(
    store: BrokerStore, stream: str, group: str, message_id: str
) -> MessageFacts:
    """Read every fact about ``message_id`` from the broker file (read-only)."""
    now_ms = store.now_ms()
    seq = jobs.seq_of(message_id)

    def query(c: sqlite3.Connection) -> MessageFacts:
        facts = MessageFacts(message_id, stream, group, now_ms)
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
            facts.ledger_ttl_s = -1 if facts.ledger else -2
        if state == "leased":
            facts.pending = {
                "consumer": consumer,
                "idle_ms": max(0, now_ms - leased_ms),
                "deliveries": deliveries,
            }
        rows = c.execute(
            "SELECT created_ms, seq, original_stream, original_id, grp, consumer, event, reason,"
            " function, handler, deliveries, handler_attempts, timestamp FROM dlq"
            " WHERE original_id = ? ORDER BY seq",
            (message_id,),
        ).fetchall()
        for r in rows:
            fields = {n: str(v) for n, v in zip(_DLQ_FIELDS, r[2:], strict=True)}
            facts.dead_letters.append(DeadLetter(jobs.message_id(r[0], r[1]), fields))
        return facts

    return await store.read(query)
