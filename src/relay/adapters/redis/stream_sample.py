"""Recent entries of a Redis stream, read for a dry run: XREVRANGE only.

Nothing here reads through a consumer group or acknowledges: ``XREVRANGE`` is a plain
range read, so the group's pending list, its last-delivered id and its counters are
exactly what they were. The cut-off of ``--since`` is taken from the Redis server's
clock, the clock that stamped the entry ids.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final

from redis.asyncio import Redis

from relay.adapters.redis.keys import translated
from relay.adapters.redis.stream import EVENT_FIELD
from relay.application.dry_run import SampledEntry, StreamNotFound
from relay.domain.retention import StreamId

PAGE: Final = 500


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def entry_time(entry_id: str) -> float:
    """Unix seconds of an entry id's millisecond part."""
    return StreamId.parse(entry_id).ms / 1000


class RedisStreamSample:
    """Newest-first pages of one stream's entries. ``client`` must return bytes."""

    def __init__(self, client: Redis, stream: str) -> None:
        self._client = client
        self._stream = stream

    async def check(self) -> None:
        """Raise :class:`StreamNotFound` unless the stream exists as a stream."""
        with translated("TYPE"):
            kind = _text(await self._client.type(self._stream))
        if kind == "none":
            raise StreamNotFound(
                f"stream {self._stream!r} does not exist on this Redis (REDIS_STREAM names it)"
            )
        if kind != "stream":
            raise StreamNotFound(f"key {self._stream!r} is a {kind}, not a stream")

    async def server_ms(self) -> int:
        with translated("TIME"):
            seconds, micros = await self._client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def newest(self, *, since_ms: int | None, limit: int) -> AsyncIterator[SampledEntry]:
        """Up to ``limit`` entries, newest first, none older than ``since_ms``."""
        low = f"{since_ms}-0" if since_ms is not None else "-"
        high = "+"
        left = limit
        while left > 0:
            with translated("XREVRANGE"):
                page: list[Any] = (
                    await self._client.xrevrange(self._stream, high, low, count=min(PAGE, left))
                    or []
                )
            for entry_id, fields in page:
                text = _text(entry_id)
                yield SampledEntry(id=text, payload=_payload(fields), at=entry_time(text))
            left -= len(page)
            if len(page) < PAGE:
                return
            high = f"({_text(page[-1][0])}"


def _payload(fields: Any) -> bytes | None:
    """The ``event`` field's bytes, as the consumer reads it (``None``: no such field)."""
    value = fields.get(EVENT_FIELD) if isinstance(fields, dict) else None
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode()
