"""Appending events to the Redis stream (``relay publish``, ingest, the DLQ republish)."""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from relay.domain.publication import Publication
from relay.domain.traceparent import TRACEPARENT_FIELD


class RedisEventPublisher:
    """The :class:`EventPublisher` port on a Redis stream: one pipelined round trip
    per call; each id is returned once Redis has appended the entry (its
    durability is the server's ``appendfsync``, as for every write of Relay's)."""

    def __init__(self, client: Redis, stream: str) -> None:
        self._client = client
        self._stream = stream

    async def append(self, publications: Sequence[Publication]) -> list[str]:
        if not publications:
            return []
        async with self._client.pipeline(transaction=False) as pipe:
            for publication in publications:
                fields: dict[str, bytes | str] = {"event": publication.payload}
                if publication.traceparent:  # beside the event, never inside it
                    fields[TRACEPARENT_FIELD] = publication.traceparent
                pipe.xadd(self._stream, fields)  # type: ignore[arg-type]
            ids = await pipe.execute()
        return [i.decode() if isinstance(i, bytes) else str(i) for i in ids]
