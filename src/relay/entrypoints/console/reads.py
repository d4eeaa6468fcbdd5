"""Every broker read the console makes, in one place.

The dead letters go through the broker's dead-letter store port and the CLI's
one selection walk (:func:`relay.entrypoints.cli.dlq_select.select`); a
message's trace through the message-facts port ``relay trace`` reads, on the
worker's open connection; the backlog through the reader the metrics sampler
uses.
"""

from __future__ import annotations

from typing import Any

from relay.adapters.brokers import Broker
from relay.adapters.metrics.server import Backlog
from relay.domain.dlq_selection import Selection
from relay.domain.message_facts import MessageFacts
from relay.entrypoints.cli.dlq_select import Selected, discard_all, select


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

    async def backlog(self) -> Backlog:
        return await self._broker.backlog()

    async def trace(self, message_id: str) -> MessageFacts:
        return await self._broker.facts.facts(message_id)
