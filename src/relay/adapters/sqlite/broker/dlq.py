"""The read side of the embedded broker's dead-letter table: the ``DeadLetterStore``
port (:mod:`relay.application.ports`), like the Redis adapter, so ``relay dlq``
and ``relay dlq replay`` read either broker the same way."""

from __future__ import annotations

import sqlite3
from typing import Any, Final

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.application.dead_letter_pages import PagedEntries
from relay.domain.dead_letters import DeadLetterNotFound, StoredDeadLetter, parse_entry_id
from relay.domain.errors import DependencyUnavailable
from relay.domain.outcome import DeadLetterEntry

_COLUMNS: Final = (
    "seq, created_ms, original_stream, original_id, grp, consumer, event, reason, function,"
    " handler, deliveries, handler_attempts, timestamp"
)


def _stored(row: tuple[Any, ...]) -> StoredDeadLetter:
    seq, created_ms, stream, original, group, consumer, event, reason, fn, handler, d, a, ts = row
    entry = DeadLetterEntry(
        original_stream=stream,
        original_id=original,
        group=group,
        consumer=consumer,
        event=event,
        reason=reason,
        function=fn,
        handler=handler,
        deliveries=d,
        handler_attempts=a,
        timestamp=ts,
    )
    return StoredDeadLetter(jobs.message_id(created_ms, seq), entry)


def _seq(entry_id: str) -> int:
    seq = jobs.seq_of(parse_entry_id(entry_id))
    assert seq is not None  # parse_entry_id accepted <ms>-<seq>
    return seq


class SqliteDeadLetterReader(PagedEntries):
    """List, fetch and delete entries of the broker file's ``dlq`` table."""

    def __init__(self, store: BrokerStore) -> None:
        self._store = store

    @property
    def key(self) -> str:
        return f"{self._store.path} (dlq)"

    async def count(self) -> int:
        rows = await self._store.read(lambda c: c.execute("SELECT count(*) FROM dlq").fetchone())
        return int(rows[0])

    async def page(
        self, *, newest_first: bool = True, count: int = 100, after: str | None = None
    ) -> list[StoredDeadLetter]:
        order = "DESC" if newest_first else "ASC"
        op = "<" if newest_first else ">"
        start = _seq(after) if after else None

        def query(c: sqlite3.Connection) -> list[Any]:
            where = f"WHERE seq {op} ?" if start is not None else ""
            args: tuple[Any, ...] = (start, count) if start is not None else (count,)
            sql = f"SELECT {_COLUMNS} FROM dlq {where} ORDER BY seq {order} LIMIT ?"  # noqa: S608 - fixed fragments
            return c.execute(sql, args).fetchall()

        return [_stored(r) for r in await self._store.read(query)]

    async def get(self, entry_id: str) -> StoredDeadLetter:
        normalised = parse_entry_id(entry_id)
        seq = _seq(normalised)
        row = await self._store.read(
            lambda c: c.execute(f"SELECT {_COLUMNS} FROM dlq WHERE seq = ?", (seq,)).fetchone()  # noqa: S608 - fixed fragments
        )
        if row is None or jobs.message_id(row[1], row[0]) != normalised:
            raise DeadLetterNotFound(f"no dead-letter entry {normalised} in {self.key}")
        return _stored(row)

    async def delete(self, entry_id: str) -> None:
        if not await self.discard(entry_id):
            normalised = parse_entry_id(entry_id)
            raise DeadLetterNotFound(f"no dead-letter entry {normalised} in {self.key}")

    async def discard(self, entry_id: str) -> bool:
        normalised = parse_entry_id(entry_id)
        seq = _seq(normalised)

        def step(c: sqlite3.Connection, _: int) -> bool:
            cur = c.execute(
                "DELETE FROM dlq WHERE seq = ? AND created_ms || '-' || seq = ?", (seq, normalised)
            )
            return cur.rowcount == 1

        return await self._store.write(step)

    async def trim_before(self, cutoff_ms: int) -> int:
        """Delete every entry written before ``cutoff_ms`` (``DLQ_RETENTION``)."""

        def step(c: sqlite3.Connection, _: int) -> int:
            return c.execute("DELETE FROM dlq WHERE created_ms < ?", (cutoff_ms,)).rowcount

        try:
            return await self._store.write(step)
        except sqlite3.Error as exc:
            raise DependencyUnavailable(f"cannot trim {self.key}: {exc}") from exc
