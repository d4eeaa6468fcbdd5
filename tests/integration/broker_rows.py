"""Reading an embedded broker's file directly, as the tests check what it holds,
and leasing what a read handed out, as a ``begin`` does."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.domain.outcome import StreamMessage


def rows(path: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """The rows ``sql`` selects from the broker file at ``path`` (its own connection)."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


async def read_held(
    store: BrokerStore, stream: SqliteEventStream, count: int
) -> list[StreamMessage]:
    """Read up to ``count`` jobs and lease them as their ``begin`` does (a read only
    peeks; the broker's own :func:`jobs.hold` leases with each delivery's handle):
    the messages this consumer now holds."""
    got = await stream.read(count, 0)
    wanted = [(jobs.seq_of(m.id) or 0, m.delivery) for m in got]

    def hold(c: sqlite3.Connection, now: int) -> set[int]:
        store.offers.forget(seq for seq, _ in wanted)  # begun: no longer offered
        return jobs.hold(c, now, stream.consumer, wanted)

    held = await store.write(hold)
    return [m for m in got if jobs.seq_of(m.id) in held]
