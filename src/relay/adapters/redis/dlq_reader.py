"""The read side of the dead-letter stream ``relay:<stream>:dlq``.

The delivery loop appends one flat entry per exhausted invocation (and one with
``-`` placeholders per malformed message). Operators list, inspect, remove and
replay those entries; this module reads and deletes them (and trims them for
``DLQ_RETENTION``). It never writes one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from relay.adapters.redis.keys import dlq_key
from relay.domain.errors import DependencyUnavailable, RelayError
from relay.domain.outcome import PLACEHOLDER, DeadLetterEntry
from relay.domain.retention import StreamId

__all__ = [
    "DeadLetterNotFound",
    "InvalidEntryId",
    "RedisDeadLetterReader",
    "StoredDeadLetter",
    "dlq_key",
]


class DeadLetterNotFound(RelayError):
    """No dead-letter entry has the given id."""


class InvalidEntryId(RelayError):
    """The given text is not a stream entry id."""


@dataclass(frozen=True, slots=True)
class StoredDeadLetter:
    """One dead-letter entry as stored: its stream id and its flat fields."""

    id: str
    entry: DeadLetterEntry

    @classmethod
    def from_reply(cls, entry_id: str | bytes, fields: Mapping[Any, Any]) -> StoredDeadLetter:
        values = {_text(k): _text(v) for k, v in fields.items()}
        return cls(_text(entry_id), DeadLetterEntry.from_fields(values))

    @property
    def replayable(self) -> bool:
        """Placeholder entries (malformed messages) name no handler to re-run."""
        e = self.entry
        return bool(e.function and e.handler) and PLACEHOLDER not in (e.function, e.handler)

    @property
    def created_ms(self) -> int:
        """When the entry was written: the millisecond part of its id."""
        return StreamId.parse(self.id).ms


def parse_entry_id(text: str) -> str:
    """Normalise a user-given id (``<ms>-<seq>``; a bare ``<ms>`` means ``<ms>-0``)."""
    try:
        return str(StreamId.parse(text.strip()))
    except ValueError:
        raise InvalidEntryId(
            f"{text!r} is not a dead-letter entry id (expected <milliseconds>-<sequence>, "
            "as shown by 'relay dlq ls')"
        ) from None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class PagedEntries:
    """``entries`` read through ``page``, the one way both brokers' readers walk
    their dead letters."""

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


class RedisDeadLetterReader(PagedEntries):
    """List, fetch and delete entries of one stream's dead-letter stream."""

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
