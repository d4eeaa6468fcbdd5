"""The write side of the dead-letter stream ``relay:<stream>:dlq``.

The delivery path writes its entries inside the ledger scripts (an entry and its
``:dlq`` marker in one atomic step); this writer is for callers outside that
path, such as a replay that failed again. ``relay.adapters.redis.dlq_reader``
reads, lists and removes entries.
"""

from __future__ import annotations

from redis.asyncio import Redis

from relay.adapters.redis.keys import dlq_key
from relay.domain.outcome import DeadLetterEntry


class RedisDeadLetterQueue:
    """:class:`relay.application.ports.DeadLetterQueue` on a Redis stream."""

    def __init__(self, client: Redis, stream: str) -> None:
        self._client = client
        self.key = dlq_key(stream)

    async def append(self, entry: DeadLetterEntry) -> str:
        entry_id = await self._client.xadd(self.key, entry.fields())  # type: ignore[arg-type]
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
