"""Schedule occurrences on the embedded broker: publish-if-new, the overlap
question, and the history ``relay schedule ls`` reads.

Publishing is one step of the writer thread, so one ``BEGIN IMMEDIATE``
transaction: the occurrence's row in ``occurrences`` (its id is the stream-scoped
dedup key, :func:`relay.domain.schedule.dedup_key`; the job's message id; an
expiry 7 days on, as the Redis dedup key's TTL) and its job are committed
together or not at all. A live row of the previous layout (the bare occurrence
id, for every stream alike) still counts as published, so an upgrade never
publishes an occurrence twice. ``BEGIN IMMEDIATE`` takes the file's write lock, so a
second worker sharing the file, or a worker restarted at the same second, finds
the row and publishes nothing: every occurrence is one job.

An occurrence's row is history only: it is never deleted when its job finishes;
rows past their expiry are deleted by later publishes (and the occurrence may
then be published again, as on Redis once the key's TTL is over).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection
from typing import Final

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.expiring import delete_expired
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.domain.ledger_rules import CLASS_FIELD, parse_class_stamp
from relay.domain.priority import priority_class
from relay.domain.schedule import (
    DEDUP_TTL_S,
    INSTANT_LENGTH,
    Envelope,
    dedup_key,
    encode,
    occurrence_id_in,
)

# The overlap check reads at most this many unfinished earlier jobs of the stream,
# oldest first; beyond that it cannot tell and the occurrence runs (at-least-once
# first), as on Redis.
UNFINISHED_SCAN: Final = 5000
# Every character of an instant sorts before this one: [prefix, prefix + _TOP) is
# exactly the occurrence ids of one schedule.
_TOP: Final = "~"


def publish_if_new(  # noqa: PLR0917 - every step has the (conn, now_ms) head
    conn: sqlite3.Connection,
    now_ms: int,
    stream: str,
    occurrence_id: str,
    payload: bytes,
    ttl_s: int,
) -> str | None:
    """The step: unless ``occurrence_id`` has a live row on ``stream`` (or one of the
    previous layout), record it and enqueue the job (``normal`` priority); the
    job's message id, or ``None``."""
    delete_expired(conn, now_ms)
    key = dedup_key(stream, occurrence_id)
    live = conn.execute(
        "SELECT 1 FROM occurrences WHERE id IN (?, ?) AND expires_ms > ?",
        (key, occurrence_id, now_ms),
    ).fetchone()
    if live:
        return None
    message_id = jobs.publish(conn, now_ms, stream, payload, priority_class(None))
    conn.execute(  # REPLACE: an expired row the batched delete has not reached yet
        "INSERT OR REPLACE INTO occurrences (id, message_id, expires_ms) VALUES (?, ?, ?)",
        (key, message_id, now_ms + ttl_s * 1000),
    )
    return message_id


class SqliteOccurrencePublisher:
    """:class:`relay.application.ports.OccurrencePublisher` on the broker file."""

    def __init__(self, store: BrokerStore, stream: str, *, ttl_s: int = DEDUP_TTL_S) -> None:
        self._store = store
        self._stream = stream
        self._ttl = ttl_s

    async def publish(self, occurrence: Envelope) -> str | None:
        stream, ttl, payload = self._stream, self._ttl, encode(occurrence)
        oid = occurrence.occurrence_id
        return await self._store.write(
            lambda c, now: publish_if_new(c, now, stream, oid, payload, ttl), wakes=True
        )


# Delivered and not acknowledged, through the two partial indexes (acknowledged
# rows, the bulk of the table, are never scanned).
_UNFINISHED: Final = (
    "SELECT u.seq, u.payload, l.value FROM ("
    " SELECT seq, payload FROM jobs INDEXED BY jobs_leased"
    "  WHERE stream = ? AND state = 'leased' AND seq < ?"
    " UNION ALL SELECT seq, payload FROM jobs INDEXED BY jobs_ready"  # occurrences: never delayed
    "  WHERE stream = ? AND state = 'ready' AND ready_ms IS NULL AND deliveries > 0 AND seq < ?"
    ") AS u LEFT JOIN ledger AS l ON l.seq = u.seq AND l.field = ?"
    " ORDER BY u.seq LIMIT ?"
)


class SqliteOccurrenceHistory:
    """:class:`relay.application.ports.OccurrenceHistory` on the broker file: the
    jobs delivered and not acknowledged (leased, or made ready again by a
    worker's restart: Redis's pending list), each one's ledger classification,
    and for one not classified yet, its envelope. One read, no write."""

    def __init__(self, store: BrokerStore, stream: str) -> None:
        self._store = store
        self._stream = stream

    async def published_as(self, occurrence_id: str) -> str | None:
        """The live row's message id; a live row of the previous layout (the bare
        occurrence id, shared by every stream) counts as naming none (``""``)."""
        key = dedup_key(self._stream, occurrence_id)
        now_ms = self._store.now_ms()

        def query(c: sqlite3.Connection) -> str | None:
            rows = dict(
                c.execute(
                    "SELECT id, message_id FROM occurrences WHERE id IN (?, ?) AND expires_ms > ?",
                    (key, occurrence_id, now_ms),
                ).fetchall()
            )
            if key in rows:
                return str(rows[key])
            return "" if occurrence_id in rows else None

        return await self._store.read(query)

    async def unfinished_before(self, prefix: str, message_id: str) -> bool:
        mine = jobs.seq_of(message_id)
        if mine is None:
            return False
        stream = self._stream
        # Handed to a reader of this process and not begun yet: delivered, as a
        # Redis entry is pending from its read on (the lease comes with the begin).
        offered = sorted(s for s in self._store.offers.snapshot() if s < mine)

        def query(c: sqlite3.Connection) -> bool:
            rows = c.execute(
                _UNFINISHED, (stream, mine, stream, mine, CLASS_FIELD, UNFINISHED_SCAN)
            ).fetchall()
            if offered:
                marks = ",".join("?" * len(offered))
                rows += c.execute(
                    "SELECT j.seq, j.payload, l.value FROM jobs AS j LEFT JOIN ledger AS l"  # noqa: S608 - placeholders
                    f" ON l.seq = j.seq AND l.field = ? WHERE j.seq IN ({marks})"
                    " AND j.stream = ? AND j.state = 'ready'",
                    (CLASS_FIELD, *offered, stream),
                ).fetchall()
            for _seq, payload, stamp in rows:
                if stamp is not None:
                    if (parse_class_stamp(str(stamp))[0] or "").startswith(prefix):
                        return True
                elif _envelope_prefix_matches(payload, prefix):
                    return True
            return False

        return await self._store.read(query)


def _envelope_prefix_matches(payload: bytes | None, prefix: str) -> bool:
    found = occurrence_id_in(payload)
    return found is not None and found.startswith(prefix)


async def latest_published(
    store: BrokerStore, stream: str, prefixes: Collection[str]
) -> dict[str, str]:
    """For each schedule prefix, its latest occurrence id on ``stream`` still
    remembered (a live row of this layout or the previous one): index ranges
    only (read-only, for ``relay schedule ls``)."""
    wanted = sorted(set(prefixes))
    now_ms = store.now_ms()
    head = dedup_key(stream, "")

    def newest(c: sqlite3.Connection, start: str) -> str | None:
        row = c.execute(
            "SELECT max(id) FROM occurrences WHERE id >= ? AND id < ?"
            " AND length(id) = ? AND expires_ms > ?",
            (start, start + _TOP, len(start) + INSTANT_LENGTH, now_ms),
        ).fetchone()
        return str(row[0]) if row and row[0] else None

    def query(c: sqlite3.Connection) -> dict[str, str]:
        latest: dict[str, str] = {}
        for prefix in wanted:
            scoped = newest(c, head + prefix)
            found = [f for f in (scoped and scoped[len(head) :], newest(c, prefix)) if f]
            if found:
                latest[prefix] = max(found)  # RFC 3339 UTC in whole seconds sorts as text
        return latest

    return await store.read(query)
