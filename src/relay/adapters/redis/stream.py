"""The event stream in Redis: one consumer of one consumer group.

The consumer's ``XREADGROUP`` runs on a connection of its own, spoken through a
small protocol (:class:`BlockingReads`): it is the one command the worker sends
for every read batch, and redis-py's per-command layers cost several times the
read itself. The rare commands (group creation, reclaim, drop) go through the
client as usual.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

import anyio
import hiredis
import msgspec
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from relay.adapters.entry_trace import entry_traceparent
from relay.adapters.redis.keys import invocation_key, translated
from relay.adapters.redis.takeover import OpenConnection, bulk, dedicated_connection
from relay.adapters.takeover import TakenOver
from relay.domain.errors import DependencyUnavailable
from relay.domain.invocation import LEDGER_RETENTION_S
from relay.domain.outcome import Reclaimed, StreamMessage
from relay.domain.traceparent import TRACEPARENT_FIELD

EVENT_FIELD: Final = b"event"
TRACE_FIELD: Final = TRACEPARENT_FIELD.encode()
READ_PATIENCE_S: Final = 10.0  # beyond a read's BLOCK time, the server counts as gone


def _no_answer(patience_s: float) -> DependencyUnavailable:
    return DependencyUnavailable(
        f"redis XREADGROUP failed: no answer {patience_s:g}s after the block time"
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _message(entry: Sequence[Any], *, reclaimed: bool) -> StreamMessage | None:
    entry_id, fields = entry[0], entry[1]
    if fields is None:  # Redis < 7 reports a deleted body as a nil field list
        return None
    if isinstance(fields, dict):
        payload, traced = fields.get(EVENT_FIELD), fields.get(TRACE_FIELD)
    else:
        payload, traced = _find(fields, EVENT_FIELD), _find(fields, TRACE_FIELD)
    message_id = _text(entry_id)
    return StreamMessage(
        id=message_id,
        payload=payload,
        deliveries=2 if reclaimed else 1,
        reclaimed=reclaimed,
        traceparent=entry_traceparent(traced, message_id) if traced else "",
    )


def _find(flat: Sequence[Any], name: bytes) -> bytes | None:
    for i in range(0, len(flat) - 1, 2):
        if flat[i] == name:
            value = flat[i + 1]
            return value if isinstance(value, bytes) else str(value).encode()
    return None


class RedisEventStream:
    """:class:`relay.application.ports.EventStream` on a Redis consumer group.

    ``client`` must return bytes (``decode_responses=False``): a payload is kept
    as the bytes Redis holds, so a non-UTF-8 one is dead-lettered, not crashed on.
    Blocking reads hold a connection; give this class its own client or pool.
    """

    def __init__(
        self,
        client: Redis,
        *,
        stream: str,
        group: str,
        consumer: str,
        ledger_ttl_s: int = LEDGER_RETENTION_S,
    ) -> None:
        self._client = client
        self._ledger_ttl_s = ledger_ttl_s
        self._stream = stream
        self._group = group
        self._consumer = consumer
        self._cursor = "0-0"
        self._reads = BlockingReads(dedicated_connection(client))
        # XREADGROUP's 11 parts, packed once but for COUNT's and BLOCK's values
        self._read_head = b"*11\r\n" + bulk(
            b"XREADGROUP", b"GROUP", group.encode(), consumer.encode(), b"COUNT"
        )
        self._read_tail = bulk(b"STREAMS", stream.encode(), b">")

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

    async def read(
        self, count: int, block_ms: int, patience_s: float = READ_PATIENCE_S
    ) -> Sequence[StreamMessage]:
        deadline = asyncio.get_running_loop().time() + block_ms / 1000 + patience_s
        try:
            reply = await self._read(count, block_ms, deadline)
            if type(reply) is hiredis.ReplyError and "NOGROUP" in str(reply):
                # The stream or group vanished (a Redis restart without persistence,
                # a manual DEL): recreate it and read again. Rare, so a cancel scope
                # bounds the re-creation (anyio's clock on asyncio is the loop's).
                with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                    await self.ensure_group()
                reply = await self._read(count, block_ms, deadline)
        except TimeoutError:
            raise _no_answer(patience_s) from None
        if type(reply) is hiredis.ReplyError:
            raise DependencyUnavailable(f"redis XREADGROUP failed: {reply}")
        # RESP3 (redis-py's default) answers a map, RESP2 a list of pairs; nil on timeout
        streams = reply.items() if isinstance(reply, dict) else reply or ()
        messages: list[StreamMessage] = []
        for _stream, entries in streams:
            for entry in entries:
                message = _message(entry, reclaimed=False)
                if message is not None:
                    messages.append(message)
        return messages

    async def _read(self, count: int, block_ms: int, deadline: float) -> Any:
        count_block = bulk(str(count).encode(), b"BLOCK", str(block_ms).encode())
        return await self._reads.call(self._read_head + count_block + self._read_tail, deadline)

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
        return [msgspec.structs.replace(m, deliveries=counts.get(m.id, 2)) for m in messages]

    async def drop(self, ids: Sequence[str]) -> None:
        """XACK ids whose body is gone and give their ledger hashes the TTL an
        acknowledged message's hash gets (``LEDGER_RETENTION``), in one MULTI:
        nothing will ever settle them, so without it they would stay forever."""
        if ids:
            with translated("XACK"):
                async with self._client.pipeline(transaction=True) as pipe:
                    pipe.xack(self._stream, self._group, *ids)
                    for message_id in ids:
                        key = invocation_key(self._stream, self._group, message_id)
                        pipe.expire(key, self._ledger_ttl_s)
                    await pipe.execute()


class _ReadLink(TakenOver):
    """The read connection: at most one command in flight."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.reply: asyncio.Future[Any] | None = None
        self.lost: BaseException | None = None

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        try:
            reply = self.reader.gets()
        except hiredis.ProtocolError as exc:
            self._end(exc)
            self.transport.abort()
            return
        if reply is not False and self.reply is not None and not self.reply.done():
            self.reply.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or ConnectionResetError("closed by the server"))
        self.release_replaced(exc)

    def _end(self, exc: BaseException) -> None:
        if self.lost is None:
            self.lost = exc
        if self.reply is not None and not self.reply.done():
            self.reply.set_exception(ConnectionError(str(exc) or type(exc).__name__))


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class BlockingReads:
    """One command at a time on a connection of its own (the consumer's reads).

    Failures follow :func:`relay.adapters.redis.connection.redis_client`: a
    connection that breaks (a Redis restart, a server-side close) is opened
    again and the command sent once more; a refused connection fails at once.
    A cancelled read (the caller's timeout, shutdown) closes the connection,
    because its reply may still come: the next read opens a new one. Errors are
    :class:`DependencyUnavailable`; an error reply is returned as the
    ``hiredis.ReplyError`` it is, for the caller to interpret.
    """

    def __init__(self, open_connection: OpenConnection) -> None:
        self._open = open_connection
        self._link: _ReadLink | None = None

    async def call(self, command: bytes, deadline: float | None = None) -> Any:
        """Send ``command`` and return its reply. With ``deadline`` (the loop's
        clock), a reply that has not come by then raises ``TimeoutError`` and the
        connection is closed, as for a cancelled read. The bound is one loop timer,
        not a cancel scope: it is armed on every read the consumer makes."""
        loop = asyncio.get_running_loop()
        for attempt in (1, 2):
            link = self._link
            if link is None or link.lost is not None or link.transport.is_closing():
                link = await self._connect(deadline)
            future: asyncio.Future[Any] = loop.create_future()
            link.reply = future
            timer = None if deadline is None else loop.call_at(deadline, _expire, future)
            try:
                link.transport.write(command)
                return await future
            except ConnectionError as exc:
                self.close()
                if attempt == 2:
                    raise DependencyUnavailable(f"redis XREADGROUP failed: {exc}") from exc
            except BaseException:
                self.close()  # the reply may still come: this connection is done
                raise
            finally:
                link.reply = None
                if timer is not None:
                    timer.cancel()
        raise AssertionError("unreachable")

    async def _connect(self, deadline: float | None) -> _ReadLink:
        link = _ReadLink()
        try:
            # anyio's clock on asyncio is the loop's; reconnecting is rare
            with anyio.fail_after(None if deadline is None else deadline - anyio.current_time()):
                await self._open(link)
        except Exception as exc:  # refused, unreachable, bad credentials, silent: one line
            if link.transport is not None:
                link.transport.abort()
            reason = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            raise DependencyUnavailable(
                f"redis XREADGROUP failed: cannot connect: {reason or type(exc).__name__}"
            ) from exc
        self._link = link
        return link

    def close(self) -> None:
        link, self._link = self._link, None
        if link is not None and link.transport is not None and not link.transport.is_closing():
            link.transport.abort()
