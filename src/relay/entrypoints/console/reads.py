"""Every broker read the console makes, in one place.

The dead letters go through the broker's dead-letter reader and the CLI's one
selection walk (:func:`relay.entrypoints.cli.dlq_select.select`); a message's
trace through the same gathering ``relay trace`` does, on the worker's open
connection; the backlog through the reader the metrics sampler uses. When the
read-side ports land (a dead-letter store, message facts), only this module is
repointed.
"""

from __future__ import annotations

from typing import Any

from relay.adapters.brokers import Broker
from relay.domain.dlq_selection import Selection
from relay.entrypoints.cli.dlq_select import Selected, discard_all, select
from relay.entrypoints.cli.trace import MessageFacts, gather
from relay.entrypoints.cli.trace_sqlite import gather_sqlite


class ConsoleReads:
    """Reads (and the one removal) on the worker's broker."""

    def __init__(self, broker: Broker, *, stream: str, group: str) -> None:
        self._broker = broker
        self._stream = stream
        self._group = group

    @property
    def broker_name(self) -> str:
        return "redis" if self._broker.name == "redis" else "embedded (SQLite)"

    @property
    def _reader(self) -> Any:
        return self._broker.dead_letters

    async def dead_letters(self, chosen: Selection) -> Selected:
        return await select(self._reader, chosen, newest_first=True)

    async def dead_letter(self, entry_id: str) -> Any:
        """The stored entry; raises a ``RelayError`` naming the id when there is none."""
        return await self._reader.get(entry_id)

    async def remove(self, ids: list[str]) -> int:
        return await discard_all(self._reader, ids)

    async def backlog(self) -> tuple[int, float]:
        return await self._broker.backlog()

    async def trace(self, message_id: str) -> MessageFacts:
        client = self._broker.client
        if self._broker.name == "redis":
            return await gather(client, self._stream, self._group, message_id)
        return await gather_sqlite(client, self._stream, self._group, message_id)
