"""The one way both brokers' dead-letter stores (and the fake) walk their entries."""

from __future__ import annotations

from collections.abc import AsyncIterator

from relay.domain.dead_letters import StoredDeadLetter


class PagedEntries:
    """``entries`` read through ``page``; a store implements ``page``."""

    async def page(
        self, *, newest_first: bool = True, count: int = 100, after: str | None = None
    ) -> list[StoredDeadLetter]:
        raise NotImplementedError

    async def entries(
        self, *, newest_first: bool = True, page_size: int = 100
    ) -> AsyncIterator[StoredDeadLetter]:
        """Every entry, read ``page_size`` at a time."""
        after: str | None = None
        while True:
            batch = await self.page(newest_first=newest_first, count=page_size, after=after)
            for entry in batch:
                yield entry
            if len(batch) < page_size:
                return
            after = batch[-1].id
