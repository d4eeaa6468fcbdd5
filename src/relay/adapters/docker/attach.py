"""Relay's end of a container's attach connection, read without aiohttp's layers.

aiodocker opens the attach connection (an HTTP upgrade on the engine's socket);
then :func:`take_over` installs an :class:`AttachChannel` as the transport's
protocol. Each invocation writes one request and waits for its answer, and on
that warm path aiodocker's per-frame queue, parser objects and drain coroutine
cost more CPU than the request itself. The channel only buffers the raw bytes
and wakes the one reader; the reader (the invoking task) splits the engine's
multiplexed frames (an 8-byte header: stream number, three zero bytes, a
big-endian length) itself, so output is forwarded by the invoking task, never
from inside the event loop's callback.

The transport may be asyncio's or uvloop's: see
:mod:`relay.adapters.takeover`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from relay.adapters.docker.lines import ProtocolError
from relay.adapters.takeover import TakenOver

# Buffered bytes past which reading pauses until the reader catches up (as
# aiodocker's queue did), so a container printing while idle cannot grow
# Relay's memory: the engine, then the container's writes, block instead.
READ_LIMIT: Final = 1 << 16
HEADER_BYTES: Final = 8
# The engine frames what it copied from the container's pipe in one read (32 KiB
# on Docker 20.10); a frame declared larger than this is not the engine's.
MAX_FRAME_BYTES: Final = 1 << 20


class DeadlinePassed(Exception):
    """The request's deadline passed before its answer came."""


class AttachChannel(TakenOver):
    """Buffers what the container's attachment sends; one reader at a time."""

    def __init__(self, transport: Any, original: Any = None) -> None:
        # made on the loop that runs the connection; kept (asyncio's
        # get_running_loop makes a getpid call each time)
        self._loop = asyncio.get_running_loop()
        self.transport = transport
        # aiohttp's protocol, told when the connection goes (it awaits that on close)
        self.replaced = original
        self._buffer = bytearray()
        self._paused = False
        # the most bytes ever held unread (what the bounds are checked against)
        self.peak = 0
        self._waiter: asyncio.Future[None] | None = None
        # the current request's deadline (loop time), and one timer reused across
        # requests: arming and cancelling a timer per request cost more than the rest
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timed_out = False
        self.closed = False
        self.error: BaseException | None = None

    # --- the transport's side ------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        held = len(buffer)
        self.peak = max(self.peak, held)
        if held > READ_LIMIT and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self.wake()

    def eof_received(self) -> bool:
        # the container's output ended: its process is gone (let the transport close)
        self.closed = True
        self.wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.error = exc
        self.wake()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.release_replaced(exc)

    # --- the reader's side -------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Send bytes to the container's stdin; ``ConnectionError`` once it is gone.

        No drain: one request is written at a time and its answer awaited, so
        the transport's buffer holds at most one request."""
        if self.closed or self.transport.is_closing():
            raise ConnectionResetError("the container's attachment is closed")
        self.transport.write(data)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet read."""
        return len(self._buffer)

    def next_frame(self) -> tuple[int, bytes] | None:
        """The next complete ``(stream, payload)`` frame received, if any;
        ``ProtocolError`` for a frame larger than ``MAX_FRAME_BYTES``."""
        buffer = self._buffer
        if len(buffer) < HEADER_BYTES:
            return None
        size = int.from_bytes(buffer[4:HEADER_BYTES], "big")
        end = HEADER_BYTES + size
        if len(buffer) < end:
            if size > MAX_FRAME_BYTES:
                raise ProtocolError(f"the attach stream sent a frame of {size} bytes")
            if self._paused:  # a frame longer than the limit: read on until it is whole
                self._paused = False
                self.transport.resume_reading()
            return None
        stream = buffer[0]
        payload = bytes(buffer[HEADER_BYTES:end])
        del buffer[:end]
        if self._paused and len(buffer) <= READ_LIMIT:
            self._paused = False
            self.transport.resume_reading()
        return stream, payload

    async def wait(self) -> None:
        """Until more bytes arrive, the connection ends or the deadline passes
        (then ``DeadlinePassed``)."""
        if self._timed_out:
            raise DeadlinePassed
        if self.closed:
            return
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None
        if self._timed_out:
            raise DeadlinePassed

    def arm(self, timeout_s: float) -> None:
        """Start a request's deadline (:meth:`wait` raises once it passed);
        :meth:`disarm` when the request is over."""
        loop = self._loop
        self._timed_out = False
        self._deadline = deadline = loop.time() + timeout_s
        timer = self._timer
        # a timer still set for an earlier request that fires first re-arms itself
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._expire)

    def disarm(self) -> None:
        """The request is over: its deadline no longer applies."""
        self._deadline = None

    # --- internals ------------------------------------------------------------------------
    def _expire(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None:
            return  # no request in progress: the timer stays off until the next one
        loop = self._loop
        if loop.time() < deadline:  # set for an earlier request (or fired early)
            self._timer = loop.call_at(deadline, self._expire)
            return
        self._timed_out = True
        self.wake()

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def take_over(stream: Any) -> AttachChannel:
    """Install a channel on an initialised aiodocker attach ``Stream``'s transport.

    Call it before the container starts, so nothing was read through aiodocker yet.
    Closing stays aiodocker's (``stream.close()``)."""
    connection = stream._resp.connection
    original = connection.protocol
    transport = original.transport
    channel = AttachChannel(transport, original)
    transport.set_protocol(channel)
    if not transport.is_reading():
        transport.resume_reading()
    return channel
