"""The read side of the dead-letter stream ``relay:<stream>:dlq``.

The delivery loop appends one flat entry per exhausted invocation (and one with
``-`` placeholders per malformed message). Operators list, inspect, remove and
replay those entries; this module reads and deletes them (and trims them for
``DLQ_RETENTION``). It never writes one.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from relay.adapters.redis.keys import dlq_key
from relay.application.dead_letter_pages import PagedEntries
from relay.domain.dead_letters import DeadLetterNotFound, StoredDeadLetter, parse_entry_id
from relay.domain.errors import DependencyUnavailable


class RedisDeadLetterReader(PagedEntries):
    """The ``DeadLetterStore`` of one stream's dead-letter stream: list, fetch, delete."""

    def __init__(self, redis: Redis, stream: str) -> None:
        self._redis = redis
        self._key = dlq_key(stream)

    @property
    def key(self) -> str:
        return self._key

    async def count(self) -> int:
        return int(await self._call(self._redis.xlen(self._key)))

    async def page(
        self, *, newest_first: bool = True, count: int = 100, after: str | None = None
    ) -> list[StoredDeadLetter]:
        """Up to ``count`` entries in the chosen order, starting past ``after``."""
        if newest_first:
            high = f"({after}" if after else "+"
            reply = await self._call(self._redis.xrevrange(self._key, high, "-", count=count))
        else:
            low = f"({after}" if after else "-"
            reply = await self._call(self._redis.xrange(self._key, low, "+", count=count))
        return [StoredDeadLetter.from_reply(entry_id, fields) for entry_id, fields in reply]

    async def get(self, entry_id: str) -> StoredDeadLetter:
        """The entry with exactly this id; raises :class:`DeadLetterNotFound`."""
        normalised = parse_entry_id(entry_id)
        reply = await self._call(self._redis.xrange(self._key, normalised, normalised, count=1))
        if not reply:
            raise DeadLetterNotFound(f"no dead-letter entry {normalised} in {self._key}")
        found_id, fields = reply[0]
        return StoredDeadLetter.from_reply(found_id, fields)

    async def delete(self, entry_id: str) -> None:
        """Delete exactly this one entry; raises :class:`DeadLetterNotFound` if absent."""
        normalised = parse_entry_id(entry_id)
        removed = int(await self._call(self._redis.xdel(self._key, normalised)))
        if removed != 1:
            raise DeadLetterNotFound(f"no dead-letter entry {normalised} in {self._key}")

    async def discard(self, entry_id: str) -> bool:
        """Delete the entry if it is still there; ``True`` when this call removed it."""
        normalised = parse_entry_id(entry_id)
        return int(await self._call(self._redis.xdel(self._key, normalised))) == 1

    async def trim_before(self, cutoff_ms: int) -> int:
        """Delete every entry written before ``cutoff_ms`` (``DLQ_RETENTION``).

        Exact, not ``~``: no group reads this stream, and an operator checking
        the window expects nothing older to be left.
        """
        return int(
            await self._call(
                self._redis.xtrim(self._key, minid=f"{max(0, cutoff_ms)}-0", approximate=False)
            )
        )

    async def _call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise DependencyUnavailable(f"cannot reach Redis: {exc}") from exc
        except RedisError as exc:
            raise DependencyUnavailable(f"Redis request on {self._key} failed: {exc}") from exc
