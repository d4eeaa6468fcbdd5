"""Schedule occurrences on Redis: publish-if-new, which entry was published, the
overlap question, history.

Publishing is one Lua script (``lua/publish_occurrence.lua``): the dedup key
``relay:occurrence:<stream>:schedule:<function>:<handler>:<scheduled_at>`` (7-day
TTL) and the stream entry are written together or not at all; a key of the
previous, unscoped layout (``relay:schedule:...``) still counts as published. It
runs through redis-py's own ``EVALSHA`` (a few calls a second at most, so not
worth the ledger's pipelined channel).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from importlib import resources
from typing import Any

from redis.asyncio import Redis

from relay.adapters.redis.keys import invocation_key, translated
from relay.domain.ledger_rules import CLASS_FIELD, parse_class_stamp
from relay.domain.schedule import (
    DEDUP_TTL_S,
    ID_PREFIX,
    INSTANT_LENGTH,
    Envelope,
    dedup_key,
    encode,
    legacy_dedup_key,
    occurrence_id_in,
)

# The overlap check pages through the group's pending entries older than the
# occurrence, oldest first, at most PENDING_PAGES x PENDING_PAGE of them; beyond
# that it cannot tell and the occurrence runs (at-least-once first).
PENDING_PAGE = 500
PENDING_PAGES = 10


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _source() -> str:
    folder = resources.files("relay.adapters.redis").joinpath("lua")
    return folder.joinpath("publish_occurrence.lua").read_text()


class RedisOccurrencePublisher:
    """:class:`relay.application.ports.OccurrencePublisher` on Redis."""

    def __init__(self, client: Redis, stream: str, *, ttl_s: int = DEDUP_TTL_S) -> None:
        self._client = client
        self._stream = stream
        self._ttl = ttl_s
        self._script = client.register_script(_source())

    async def publish(self, occurrence: Envelope) -> str | None:
        oid = occurrence.occurrence_id
        keys = [dedup_key(self._stream, oid), self._stream, legacy_dedup_key(oid)]
        with translated("schedule publish"):
            added = await self._script(keys=keys, args=[encode(occurrence), self._ttl])
        return None if added is None else _text(added)


class RedisOccurrenceHistory:
    """:class:`relay.application.ports.OccurrenceHistory` on Redis: the group's
    pending list, each entry's ledger classification (an occurrence's is its id),
    and for an entry not classified yet, its envelope."""

    def __init__(self, client: Redis, stream: str, group: str) -> None:
        self._client = client
        self._stream = stream
        self._group = group

    async def published_as(self, occurrence_id: str) -> str | None:
        """The dedup key's value (the script stores the appended entry's id); a key
        of the previous layout names no entry (``""``). Two GETs in one round trip."""
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.get(dedup_key(self._stream, occurrence_id))
            pipe.get(legacy_dedup_key(occurrence_id))
            with translated("GET"):
                current, legacy = await pipe.execute()
        if current is not None:
            return _text(current)
        return None if legacy is None else ""

    async def unfinished_before(self, prefix: str, message_id: str) -> bool:
        low = "-"
        with translated("XPENDING"):
            for _ in range(PENDING_PAGES):
                rows = await self._client.xpending_range(
                    self._stream, self._group, min=low, max=f"({message_id}", count=PENDING_PAGE
                )
                ids = [_text(r["message_id"]) for r in rows]
                if await self._any_of(ids, prefix):
                    return True
                if len(ids) < PENDING_PAGE:
                    return False
                low = f"({ids[-1]}"
        return False  # more pending than the scan covers: cannot tell, so it runs

    async def _any_of(self, ids: list[str], prefix: str) -> bool:
        if not ids:
            return False
        async with self._client.pipeline(transaction=False) as pipe:
            for entry_id in ids:
                pipe.hget(invocation_key(self._stream, self._group, entry_id), CLASS_FIELD)
            stamps: Sequence[Any] = await pipe.execute()
        unclassified: list[str] = []
        for entry_id, stamp in zip(ids, stamps, strict=True):
            if stamp is None:
                unclassified.append(entry_id)
            elif (parse_class_stamp(_text(stamp))[0] or "").startswith(prefix):
                return True
        return await self._any_envelope(unclassified, prefix)

    async def _any_envelope(self, ids: list[str], prefix: str) -> bool:
        """An entry delivered but not begun yet: its body says what it is."""
        for entry_id in ids:
            rows: Any = await self._client.xrange(self._stream, entry_id, entry_id)
            for _, fields in rows:
                if _envelope_prefix_matches(fields, prefix):
                    return True
        return False


def _envelope_prefix_matches(fields: dict[Any, Any], prefix: str) -> bool:
    found = occurrence_id_in(fields.get(b"event", fields.get("event")))
    return found is not None and found.startswith(prefix)


async def latest_published(
    client: Redis, stream: str, prefixes: Collection[str]
) -> dict[str, str]:
    """For each schedule prefix (:func:`relay.domain.schedule.schedule_prefix`), its
    latest occurrence id on ``stream`` still remembered by a dedup key: one ``SCAN``
    over the stream's keys, one over the previous layout's (read-only, for
    ``relay schedule ls``)."""
    wanted = set(prefixes)
    latest: dict[str, str] = {}
    with translated("SCAN"):
        for head in (dedup_key(stream, ""), legacy_dedup_key("")):
            async for key in client.scan_iter(match=head + ID_PREFIX + "*", count=1000):
                occurrence = _text(key).removeprefix(head)
                prefix = occurrence[: -INSTANT_LENGTH]
                # RFC 3339 UTC in whole seconds sorts as text
                if prefix in wanted and occurrence > latest.get(prefix, ""):
                    latest[prefix] = occurrence
    return latest
