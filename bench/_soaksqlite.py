"""The soak's broker under test when it is the embedded one (``--broker sqlite``):
events go in through Relay's own publisher, dead letters come out through its
reader, and the rest is read from the broker file the workers share.

Shaped like ``soak.RedisBroker`` (the ``soak.Broker`` protocol), so the soak's
production, chaos, settling and report are the same code on both brokers.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from relay.adapters.sqlite.broker.dlq import SqliteDeadLetterReader
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock

RECENT_MS = 2000  # "the last moments" of the mid-batch kill, as on Redis


class SqliteBroker:
    def __init__(self, path: Path, stream: str) -> None:
        self.path = path
        self.stream = stream
        self.store = BrokerStore(path, SystemClock())
        self.publisher = SqliteEventPublisher(self.store, stream)
        self.dead_letters = SqliteDeadLetterReader(self.store)

    def worker_env(self) -> dict[str, str]:
        """What puts a ``relay start`` on this file (REDIS_STREAM and REDIS_GROUP
        still name the stream and group there)."""
        return {"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(self.path)}

    async def send(self, bodies: list[dict[str, Any]], *, together: bool) -> str:
        # One publish call is one transaction, so a burst is always taken together.
        ids = await self.publisher.publish([(json.dumps(b).encode(), None) for b in bodies])
        return ids[-1]

    async def in_flight(self, consumer: str) -> int:
        """Jobs ``consumer`` leased (or renewed) in the last 2 s and has not acked."""
        since = self.store.now_ms() - RECENT_MS
        return await self._count(
            "state = 'leased' AND consumer = ? AND leased_ms >= ?", consumer, since
        )

    async def settled(self, last: str) -> tuple[bool, int]:
        """Every job published before this call is a row already (the publisher
        returns after its commit): nothing un-acked left means all settled."""
        pending = await self._count("state != 'acked'")
        return pending == 0, pending

    async def ledger_fields(self) -> list[tuple[str, str]]:
        rows = await self.store.read(
            lambda c: c.execute(
                "SELECT l.field, l.value FROM ledger l JOIN jobs j ON j.seq = l.seq"
                " WHERE j.stream = ?",
                (self.stream,),
            ).fetchall()
        )
        return [(str(f), str(v)) for f, v in rows]

    async def dead_letter_events(self) -> list[str | None]:
        return [
            stored.entry.event
            async for stored in self.dead_letters.entries(newest_first=False, page_size=500)
            if stored.entry.original_stream == self.stream
        ]

    async def close(self) -> None:
        self.store.close()  # the file goes with the bench's work directory

    async def _count(self, where: str, *args: object) -> int:
        sql = f"SELECT count(*) FROM jobs WHERE stream = ? AND {where}"

        def query(c: sqlite3.Connection) -> int:
            return int(c.execute(sql, (self.stream, *args)).fetchone()[0])

        return await self.store.read(query)
