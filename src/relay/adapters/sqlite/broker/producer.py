"""Appending events to the embedded broker (``relay publish``, ingest, tests, benches).

A delayed publication is a job with ``ready_ms`` (the claim skips it until then,
see :mod:`.jobs`). An idempotency key is a row of ``occurrences`` (the table the
schedules' publish-if-new keeps, under ids of its own shape,
:func:`relay.domain.publication.key_record`) holding the first job's id until the
window ends; rows past their expiry are deleted by later keyed publishes, a
batch at a time, as the schedules' are. The look-up, the job and the row are one
``BEGIN IMMEDIATE`` transaction, the file's write lock across processes: two
publishers of one key, in one process or two, make one job.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.expiring import delete_expired
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.domain.durations import MILLISECOND
from relay.domain.priority import priority_class
from relay.domain.publication import (
    DEFAULT_DEDUP_WINDOW_NS,
    Publication,
    check_all,
    due_ms,
    key_record,
)


class SqliteEventPublisher:
    """Adds jobs to the broker file's queue (the :class:`EventPublisher` port):
    one transaction per call, committed before the ids are returned.
    ``dedup_window_ns``: how long an idempotency key answers with its first id
    (``PUBLISH_DEDUP_WINDOW``)."""

    def __init__(
        self, store: BrokerStore, stream: str, *, dedup_window_ns: int = DEFAULT_DEDUP_WINDOW_NS
    ) -> None:
        self._store = store
        self._stream = stream
        self._window_ms = max(1, dedup_window_ns // MILLISECOND)

    async def publish(
        self, events: Sequence[tuple[bytes, str | None]], traceparent: str = ""
    ) -> list[str]:
        """``append`` of ``(event, priority)`` pairs, each with ``traceparent`` (a
        valid W3C one, or "" for none): tests' and benches' shorthand."""
        return await self.append(
            [Publication(payload, priority, traceparent=traceparent or None)
             for payload, priority in events]
        )

    async def append(self, publications: Sequence[Publication]) -> list[str]:
        """Append in order; their message ids. Raises
        :class:`relay.domain.priority.InvalidPriority` or
        :class:`relay.domain.publication.InvalidPublication` before writing anything."""
        for p in publications:
            priority_class(p.priority)
        check_all(publications, self._store.now_ms())
        stream, window_ms = self._stream, self._window_ms
        items = list(publications)

        def step(conn: sqlite3.Connection, now_ms: int) -> list[str]:
            return append_step(conn, now_ms, stream, items, window_ms)

        return await self._store.write(step, wakes=True)


def append_step(
    conn: sqlite3.Connection,
    now_ms: int,
    stream: str,
    publications: Sequence[Publication],
    window_ms: int,
) -> list[str]:
    """The writer's step: each publication's job, or the id its key already names."""
    keyed = any(p.idempotency_key is not None for p in publications)
    if keyed:
        delete_expired(conn, now_ms)
    ids: list[str] = []
    for p in publications:
        record = None if p.idempotency_key is None else key_record(stream, p.idempotency_key)
        if record is not None:
            row = conn.execute(
                "SELECT message_id FROM occurrences WHERE id = ? AND expires_ms > ?",
                (record, now_ms),
            ).fetchone()
            if row is not None:
                ids.append(str(row[0]))
                continue
        ready_ms = due_ms(p.deliver_at_ms, now_ms)
        message_id = jobs.publish(
            conn, now_ms, stream, p.payload, priority_class(p.priority),
            ready_ms=ready_ms, traceparent=p.traceparent,
        )
        if record is not None:
            conn.execute(  # REPLACE: an expired row the batched delete has not reached yet
                "INSERT OR REPLACE INTO occurrences (id, message_id, expires_ms) VALUES (?, ?, ?)",
                (record, message_id, now_ms + window_ms),
            )
        ids.append(message_id)
    return ids

