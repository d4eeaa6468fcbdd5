"""``MessageFactsReader`` on Redis: what the stream, the group and the ledger hash
know about one message, read-only (``relay trace``).

The ledger hash (``relay:invocation:{stream}:{group}:{id}``), the entry itself,
its place in the group's pending list (``XPENDING``) and the dead-letter entries
it produced, read at the server's clock.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from relay.adapters.redis.admin_checks import redis_target_problem
from relay.adapters.redis.keys import (
    delayed_events_key,
    delayed_key,
    dlq_key,
    invocation_key,
)
from relay.domain.errors import ConfigError, DependencyUnavailable, RelayError
from relay.domain.message_facts import DLQ_SCAN_LIMIT, DeadLetterFact, MessageFacts
from relay.domain.publication import delayed_due
from relay.domain.retention import StreamId

_PAGE = 500
MOVED_SCAN_LIMIT = 10_000  # entries a moved delayed event is looked for among


class RedisMessageFacts:
    """The facts of one stream's messages as one consumer group sees them."""

    def __init__(self, redis: Redis, stream: str, group: str) -> None:
        self._redis = redis
        self._stream = stream
        self._group = group

    async def facts(self, message_id: str) -> MessageFacts:
        """Every fact about ``message_id``; ``ConfigError`` when the stream or the
        group does not exist (a typo must not read as "unknown message")."""
        try:
            problem = await redis_target_problem(self._redis, self._stream, self._group)
            if problem is not None:
                raise ConfigError(problem)
            if delayed_due(message_id) is not None:
                return await self._delayed(message_id)
            return await self._gather(message_id)
        except (RedisError, OSError) as exc:
            raise DependencyUnavailable(f"cannot read from Redis: {exc}") from exc

    async def _delayed(self, delayed: str) -> MessageFacts:
        """A delayed id (``delayed-<due ms>-<n>``, docs/producing.md): while it waits,
        its due time; once moved, the facts of the stream entry it became (their
        ``message_id`` says which), found among the :data:`MOVED_SCAN_LIMIT` entries
        from its due time on by the entry's ``delayed`` field."""
        redis, stream = self._redis, self._stream
        due = await redis.zscore(delayed_key(stream), delayed)
        if due is not None:
            seconds, micros = await redis.time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
            facts = MessageFacts(delayed, stream, self._group, now_ms)
            body = await redis.hget(delayed_events_key(stream), delayed)
            facts.body_bytes = None if body is None else len(body)
            facts.delayed_until_ms = int(due)
            return facts
        entry = await self._moved_to(delayed)
        if entry is None:
            raise RelayError(
                f"delayed id {delayed} is not waiting, and no entry of the {MOVED_SCAN_LIMIT}"
                f" from its due time on in stream {stream!r} carries it (never published"
                " there, or trimmed)"
            )
        return await self._gather(entry)

    async def _moved_to(self, delayed: str) -> str | None:
        """The stream id of the entry moved from ``delayed``, scanning from its due time."""
        low = f"{delayed_due(delayed)}-0"
        seen = 0
        while seen < MOVED_SCAN_LIMIT:
            batch: Any = await self._redis.xrange(self._stream, low, "+", count=_PAGE)
            for entry_id, fields in batch:
                mark = (fields or {}).get(b"delayed", (fields or {}).get("delayed"))
                if mark is not None and _text(mark) == delayed:
                    return _text(entry_id)
            seen += len(batch)
            if len(batch) < _PAGE:
                return None
            low = "(" + _text(batch[-1][0])
        return None

    async def _gather(self, message_id: str) -> MessageFacts:
        redis, stream, group = self._redis, self._stream, self._group
        seconds, micros = await redis.time()
        facts = MessageFacts(message_id, stream, group, int(seconds) * 1000 + int(micros) // 1000)
        key = invocation_key(stream, group, message_id)
        facts.ledger = {_text(k): _text(v) for k, v in (await redis.hgetall(key)).items()}
        facts.ledger_ttl_s = int(await redis.ttl(key))
        entries: Any = await redis.xrange(stream, message_id, message_id, count=1)
        if entries:
            _id, fields = entries[0]
            facts.body_bytes = sum(len(value) for value in (fields or {}).values())
        try:
            pending = await redis.xpending_range(stream, group, message_id, message_id, 1)
        except RedisError:  # no such group (or stream): nothing is pending in it
            pending = []
        if pending:
            p = pending[0]
            facts.pending = {
                "consumer": _text(p["consumer"]),
                "idle_ms": int(p["time_since_delivered"]),
                "deliveries": int(p["times_delivered"]),
            }
        facts.dead_letters, facts.dlq_scan_complete = await self._dead_letters(message_id)
        return facts

    async def _dead_letters(self, message_id: str) -> tuple[list[DeadLetterFact], bool]:
        """Entries whose ``original_id`` is the message: written after it, so the scan
        starts at the message's millisecond and stops after ``DLQ_SCAN_LIMIT`` entries."""
        key = dlq_key(self._stream)
        low = f"{StreamId.parse(message_id).ms}-0"
        found: list[DeadLetterFact] = []
        seen = 0
        while seen < DLQ_SCAN_LIMIT:
            batch: Any = await self._redis.xrange(key, low, "+", count=_PAGE)
            for entry_id, raw in batch:
                fields = {_text(k): _text(v) for k, v in (raw or {}).items()}
                if fields.get("original_id") == message_id:
                    found.append(DeadLetterFact(_text(entry_id), fields))
            seen += len(batch)
            if len(batch) < _PAGE:
                return found, True
            low = "(" + _text(batch[-1][0])
        return found, False


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
