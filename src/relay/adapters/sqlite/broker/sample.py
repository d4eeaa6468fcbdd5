"""Recent jobs of the embedded broker, read for a dry run: plain SELECTs.

Reads go through :meth:`BrokerStore.read` (a connection of its own, outside the
writer's transactions), so no job is leased, renewed or acknowledged, and every job
still in the file is read whatever its state, as ``XREVRANGE`` reads a stream.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.application.dry_run import SampledEntry, StreamNotFound

PAGE: Final = 500


class SqliteStreamSample:
    """Newest-first pages of one stream's jobs in the broker file."""

    def __init__(self, store: BrokerStore, stream: str) -> None:
        self._store = store
        self._stream = stream

    async def check(self) -> None:
        """A file holding jobs of other streams only names the wrong stream: say so.
        (An empty file is just an empty queue.)"""

        def query(c: sqlite3.Connection) -> list[str]:
            if c.execute("SELECT 1 FROM jobs WHERE stream = ? LIMIT 1", (self._stream,)).fetchone():
                return []
            rows = c.execute("SELECT DISTINCT stream FROM jobs LIMIT 5").fetchall()
            return [str(r[0]) for r in rows]

        others = await self._store.read(query)
        if others:
            raise StreamNotFound(
                f"stream {self._stream!r} has no entries in broker file {self._store.path}"
                f" (it holds {', '.join(repr(o) for o in others)}; REDIS_STREAM names it)"
            )

    async def server_ms(self) -> int:
        return self._store.now_ms()

    async def newest(self, *, since_ms: int | None, limit: int) -> AsyncIterator[SampledEntry]:
        """Up to ``limit`` jobs, newest first, stopping at the first one created before
        ``since_ms`` (rows are walked down the primary key, so a cut-off costs no scan
        of the older rows)."""
        before: int | None = None
        left = limit
        while left > 0:
            rows = await self._store.read(self._page(before, min(PAGE, left)))
            for seq, created_ms, payload in rows:
                if since_ms is not None and created_ms < since_ms:
                    return
                yield SampledEntry(
                    id=jobs.message_id(created_ms, seq), payload=payload, at=created_ms / 1000
                )
            left -= len(rows)
            if len(rows) < PAGE:
                return
            before = rows[-1][0]

    def _page(self, before: int | None, count: int) -> Callable[[sqlite3.Connection], list[Any]]:
        def query(c: sqlite3.Connection) -> list[Any]:
            if before is None:
                sql = "SELECT seq, created_ms, payload FROM jobs WHERE stream = ?"
                args: tuple[Any, ...] = (self._stream, count)
            else:
                sql = "SELECT seq, created_ms, payload FROM jobs WHERE stream = ? AND seq < ?"
                args = (self._stream, before, count)
            return c.execute(sql + " ORDER BY seq DESC LIMIT ?", args).fetchall()

        return query
