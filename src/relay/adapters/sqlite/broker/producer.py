"""Appending events to the embedded broker (``relay publish``, tests, benches)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.domain.priority import priority_class


class SqliteEventPublisher:
    """Adds jobs to the broker file's queue: one transaction per call, committed
    before the ids are returned."""

    def __init__(self, store: BrokerStore, stream: str) -> None:
        self._store = store
        self._stream = stream

    async def publish(
        self, events: Sequence[tuple[bytes, str | None]], traceparent: str = ""
    ) -> list[str]:
        """Append ``(event, priority)`` pairs in order, each with ``traceparent``
        (a valid W3C one, or "" for none); their message ids. Raises
        :class:`relay.domain.priority.InvalidPriority` before writing anything."""
        rows = [(payload, priority_class(priority)) for payload, priority in events]
        stream = self._stream

        def step(conn: sqlite3.Connection, now_ms: int) -> list[str]:
            return [jobs.publish(conn, now_ms, stream, p, c, traceparent) for p, c in rows]

        return await self._store.write(step, wakes=True)
