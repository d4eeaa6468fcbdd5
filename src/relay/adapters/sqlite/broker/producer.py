"""Appending events to the embedded broker (``relay publish``, ingest, tests, benches)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.domain.priority import priority_class
from relay.domain.publication import Publication


class SqliteEventPublisher:
    """Adds jobs to the broker file's queue (the :class:`EventPublisher` port):
    one transaction per call, committed before the ids are returned."""

    def __init__(self, store: BrokerStore, stream: str) -> None:
        self._store = store
        self._stream = stream

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
        :class:`relay.domain.priority.InvalidPriority` before writing anything."""
        rows = [(p.payload, priority_class(p.priority), p.traceparent) for p in publications]
        stream = self._stream

        def step(conn: sqlite3.Connection, now_ms: int) -> list[str]:
            return [jobs.publish(conn, now_ms, stream, p, c, t) for p, c, t in rows]

        return await self._store.write(step, wakes=True)
