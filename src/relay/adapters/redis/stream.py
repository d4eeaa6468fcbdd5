"""The event stream in Redis: one consumer of one consumer group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from relay.adapters.redis.keys import translated
from relay.domain.outcome import Reclaimed, StreamMessage

EVENT_FIELD: Final = b"event"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _message(entry: Sequence[Any], *, reclaimed: bool) -> StreamMessage | None:
    entry_id, fields = entry[0], entry[1]
    if fields is None:  # Redis < 7 reports a deleted body as a nil field list
        return None
    payload = fields.get(EVENT_FIELD) if isinstance(fields, dict) else _find(fields)
    return StreamMessage(
        id=_text(entry_id), payload=payload, deliveries=2 if reclaimed else 1, reclaimed=reclaimed
    )


def _find(flat: Sequence[Any]) -> bytes | None:
    for i in range(0, len(flat) - 1, 2):
        if flat[i] == EVENT_FIELD:
            value = flat[i + 1]
            return value if isinstance(value, bytes) else str(value).encode()
    return None


class RedisEventStream:
    """:class:`relay.application.ports.EventStream` on a Redis consumer group.

    ``client`` must return bytes (``decode_responses=False``): a payload is kept
    as the bytes Redis holds, so a non-UTF-8 one is dead-lettered, not crashed on.
    Blocking reads hold a connection; give this class its own client or pool.
    """

    def __init__(self, client: Redis, *, stream: str, group: str, consumer: str) -> None:
        self._client = client
        self._stream = stream
        self._group = group
        self._consumer = consumer
        self._cursor = "0-0"

    @property
    def stream(self) -> str:
        return self._stream

    @property
    def group(self) -> str:
        return self._group

    @property
    def consumer(self) -> str:
        return self._consumer

    async def ensure_group(self) -> None:
        with translated("XGROUP CREATE"):
            await self._ensure_group()

    async def _ensure_group(self) -> None:
        try:
            await self._client.xgroup_create(self._stream, self._group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read(self, count: int, block_ms: int) -> Sequence[StreamMessage]:
        with translated("XREADGROUP"):
            return await self._read_messages(count, block_ms)

    async def _read_messages(self, count: int, block_ms: int) -> Sequence[StreamMessage]:
        try:
            reply = await self._read(count, block_ms)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The stream or group vanished (a Redis restart without persistence,
            # a manual DEL): recreate it and read again.
            await self._ensure_group()
            reply = await self._read(count, block_ms)
        messages: list[StreamMessage] = []
        for _stream, entries in reply or ():
            for entry in entries:
                message = _message(entry, reclaimed=False)
                if message is not None:
                    messages.append(message)
        return messages

    async def _read(self, count: int, block_ms: int) -> Any:
        return await self._client.xreadgroup(
            self._group, self._consumer, {self._stream: ">"}, count=count, block=block_ms
        )

    async def reclaim(self, min_idle_ms: int, count: int) -> Reclaimed:
        """One ``XAUTOCLAIM`` step from the saved cursor (it wraps to ``0-0``).

        Sent as a raw command so the third reply element, the ids of deleted
        entries (Redis 7+), is not lost the way redis-py's parsed form loses it.
        """
        with translated("XAUTOCLAIM"):
            return await self._reclaim(min_idle_ms, count)

    async def _reclaim(self, min_idle_ms: int, count: int) -> Reclaimed:
        reply = await self._client.execute_command(  # type: ignore[no-untyped-call]
            "XAUTOCLAIM",
            self._stream,
            self._group,
            self._consumer,
            min_idle_ms,
            self._cursor,
            "COUNT",
            count,
        )
        self._cursor = _text(reply[0])
        messages: list[StreamMessage] = []
        deleted: list[str] = [_text(i) for i in (reply[2] if len(reply) > 2 else ())]
        for entry in reply[1]:
            message = _message(entry, reclaimed=True)
            if message is None:
                deleted.append(_text(entry[0]))
            else:
                messages.append(message)
        if messages:
            messages = await self._with_deliveries(messages)
        return Reclaimed(
            messages=tuple(messages), deleted=tuple(deleted), complete=self._cursor == "0-0"
        )

    async def _with_deliveries(self, messages: list[StreamMessage]) -> list[StreamMessage]:
        """The delivery counts (diagnostic) from the pending list, one round trip."""
        first, last = messages[0].id, messages[-1].id
        rows = await self._client.xpending_range(
            self._stream, self._group, min=first, max=last, count=len(messages) * 2 + 10
        )
        counts = {_text(r["message_id"]): int(r["times_delivered"]) for r in rows}
        return [
            StreamMessage(
                id=m.id, payload=m.payload, deliveries=counts.get(m.id, 2), reclaimed=True
            )
            for m in messages
        ]

    async def drop(self, ids: Sequence[str]) -> None:
        if ids:
            with translated("XACK"):
                await self._client.xack(self._stream, self._group, *ids)
