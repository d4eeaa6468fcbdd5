"""Lua scripts on one dedicated, pipelined connection: the ledger's hot path.

Every read batch makes one ``begin_many`` call and every settle group one
``finish_many`` (single messages: ``begin`` and ``finish``). They go
through :class:`ScriptChannel`, which speaks RESP itself on one connection of
its own through an :class:`asyncio.Protocol`, with no task of its own:

- *writing*: a call is queued, and the first call of an event-loop iteration
  schedules one flush for the end of that iteration (``loop.call_soon``). The
  flush writes everything queued meanwhile with one ``transport.write``: the
  calls of one read batch of messages share one round trip;
- *reading*: a hiredis reader is fed in ``data_received``; replies come back in
  the order the calls were written, and each one wakes the oldest call still
  waiting. A new batch never waits for the previous batch's replies.

The connection is one of the client's pool, taken over from redis-py (see
:mod:`relay.adapters.redis.takeover`), so it honours everything the client's
URL says. Scripts are loaded (``SCRIPT LOAD``) ahead of their first call on
each new connection, in the same write.

Each call waits bounded (30 s, one timer for the whole channel) and shielded
from its caller's cancellation, so a call handed to Redis reaches its caller: an
anyio cancel scope's cancellation is caught and the call awaited to its end,
and the scope cancels the caller again at its next checkpoint (a bare
``Task.cancel()``, which no anyio shield stops, is let through). Failures follow
:func:`relay.adapters.redis.connection.redis_client`: a broken connection (a
Redis restart) is re-opened and every call it left unanswered is sent once more
(safe: each script is fenced by its token); a refused connection or a timeout
fails the calls with :class:`DependencyUnavailable`, never retried, and an
error reply fails its call with the server's message. A ``NOSCRIPT`` reply
(``SCRIPT FLUSH``, a restart) loads the script on the connection and sends the
call again. Nothing here is retried more than once.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

import anyio
import hiredis

from relay.adapters.redis.takeover import OpenConnection, command
from relay.adapters.takeover import TakenOver
from relay.domain.errors import DependencyUnavailable

SEND_TIMEOUT_S: Final = 30.0


class LuaScript:
    """A script's source and the SHA1 that ``EVALSHA`` names it by."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        self._head = b"*%%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n" % self.sha.encode()
        self._load = command(b"SCRIPT", b"LOAD", source.encode())

    def evalsha(self, keys: Sequence[str], args: Sequence[str]) -> bytes:
        """The packed ``EVALSHA`` command.

        Unrolled rather than built with ``takeover.bulk``: two calls per handled
        event, and collecting the parts first cost half as much again."""
        nkeys = b"%d" % len(keys)
        out = [self._head % (3 + len(keys) + len(args)), b"$%d\r\n%s\r\n" % (len(nkeys), nkeys)]
        for text in keys:
            raw = text.encode()
            out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
        for text in args:
            raw = text.encode()
            out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
        return b"".join(out)

    def load_command(self) -> bytes:
        """The packed ``SCRIPT LOAD`` command."""
        return self._load


class _Call:
    __slots__ = (
        "batch", "data", "deadline", "done", "error", "future", "must_open", "reply",
        "retried", "script",
    )

    def __init__(self, script: LuaScript, data: bytes, future: Any, deadline: float) -> None:
        self.script = script
        self.data = data
        self.future: asyncio.Future[None] = future  # woken when done or told to open
        self.deadline = deadline
        self.batch = 0  # the flush that wrote it
        self.retried = False
        self.must_open = False  # this caller opens the connection for everyone
        self.done = False
        self.reply: Any = None
        self.error: BaseException | None = None


class _Link(TakenOver):
    """One connection: the calls written on it, in order, and the scripts loaded."""

    def __init__(self, channel: ScriptChannel) -> None:
        self.channel: ScriptChannel | None = channel  # None once the channel dropped it
        self.reader = hiredis.Reader()
        self.waiting: deque[_Call | None] = deque()  # None: a SCRIPT LOAD's reply
        self.loaded: dict[str, int] = {}  # sha -> the flush that loaded it

    def data_received(self, data: bytes) -> None:
        channel = self.channel
        if channel is None:
            return
        reader = self.reader
        reader.feed(data)
        try:
            while (reply := reader.gets()) is not False:
                channel._reply(self, reply)
                if self.channel is None:
                    return  # dropped meanwhile (an unexpected reply)
        except hiredis.ProtocolError as exc:
            channel._broken(self, exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.channel is not None:
            self.channel._broken(self, exc or ConnectionResetError("closed by the server"))
        self.release_replaced(exc)


class ScriptChannel:
    """Concurrent script calls pipelined on one connection (see the module text)."""

    def __init__(
        self, open_connection: OpenConnection, *, timeout_s: float = SEND_TIMEOUT_S
    ) -> None:
        self._open = open_connection
        self._timeout_s = timeout_s
        self._link: _Link | None = None
        self._opening = False
        self._unsent: list[_Call] = []
        self._flush_due = False
        self._watchdog: asyncio.TimerHandle | None = None
        self._batches = 0
        self.round_trips = 0  # writes made (for the benches)
        self.calls = 0

    async def call(self, script: LuaScript, keys: Sequence[str], args: Sequence[str]) -> Any:
        loop = asyncio.get_running_loop()
        call = _Call(
            script, script.evalsha(keys, args), loop.create_future(),
            loop.time() + self._timeout_s,
        )
        self.calls += 1
        self._queue(call, loop)
        if self._watchdog is None:
            self._watchdog = loop.call_at(call.deadline, self._check_deadlines)
        # The wait is shielded without a cancel scope per call (the scope was the
        # larger part of a call's cost): a cancellation that lands here is caught,
        # and when it is an anyio cancel scope's, the call is awaited to its end
        # under a shield; the scope then cancels the caller at its next checkpoint,
        # as it would after any shielded wait. A plain asyncio cancellation, which
        # no anyio shield stops either, is let through.
        try:
            await call.future
        except asyncio.CancelledError:
            if anyio.current_effective_deadline() != -math.inf:
                self._abandon(call)
                raise
            with anyio.CancelScope(shield=True):
                await self._wait(call, loop)
        else:
            if not call.done:  # woken to open the connection
                with anyio.CancelScope(shield=True):
                    await self._wait(call, loop)
        if call.error is not None:
            raise call.error
        return call.reply

    async def _wait(self, call: _Call, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while not call.done:
                if call.must_open:
                    call.must_open = False
                    await self._connect(call)
                else:
                    call.future = loop.create_future()
                    await call.future
        except BaseException:  # a plain asyncio cancellation: shields don't stop those
            self._abandon(call)
            raise

    def _abandon(self, call: _Call) -> None:
        """The caller is gone: an unsent call is not sent (a written one's reply is
        dropped when it comes), and the task of opening passes on."""
        if call in self._unsent:
            self._unsent.remove(call)
        if call.must_open:
            call.must_open = False
            self._opening = False
            self._hand_open()

    # --- writing -------------------------------------------------------------------------

    def _queue(self, call: _Call, loop: asyncio.AbstractEventLoop) -> None:
        self._unsent.append(call)
        if self._link is not None:
            if not self._flush_due:
                self._flush_due = True
                loop.call_soon(self._flush)
        elif not self._opening:
            self._hand_open()

    def _flush(self) -> None:
        self._flush_due = False
        link = self._link
        if link is None or not self._unsent:
            return  # the calls wait for the connection being opened
        calls, self._unsent = self._unsent, []
        self._batches += 1
        batch = self._batches
        waiting, loaded = link.waiting, link.loaded
        parts: list[bytes] = []
        for call in calls:
            script = call.script
            if script.sha not in loaded:
                loaded[script.sha] = batch
                parts.append(script.load_command())
                waiting.append(None)
            parts.append(call.data)
            call.batch = batch
            waiting.append(call)
        self.round_trips += 1
        link.transport.write(b"".join(parts))

    def _hand_open(self) -> None:
        """Nobody is connected or connecting: the oldest queued caller opens."""
        if self._link is None and not self._opening and self._unsent:
            self._opening = True
            call = self._unsent[0]
            call.must_open = True
            _wake(call)

    async def _connect(self, opener: _Call) -> None:
        link = _Link(self)
        failure: Exception | None = None
        try:
            # anyio's clock on asyncio is the loop's: the opener's own deadline bounds it
            with anyio.CancelScope(deadline=opener.deadline) as scope:
                await self._open(link)
        except Exception as exc:  # noqa: BLE001 - refused: each caller gets the error
            failure = exc
        except BaseException:  # this caller is cancelled (plain asyncio): another opens
            self._opening = False
            link.channel = None
            if link.transport is not None:
                link.transport.abort()
            self._hand_open()
            raise
        else:
            if scope.cancelled_caught:
                failure = TimeoutError("timed out")
        self._opening = False
        if failure is not None:
            link.channel = None
            if link.transport is not None:
                link.transport.abort()
            error = DependencyUnavailable(
                f"redis ledger connection failed: {str(failure) or type(failure).__name__}"
            )
            calls, self._unsent = self._unsent, []
            for call in calls:
                _finish(call, error=error)
            return
        self._link = link
        self._flush()

    # --- reading -------------------------------------------------------------------------

    def _reply(self, link: _Link, reply: Any) -> None:
        if not link.waiting:
            self._broken(link, ConnectionError("a reply nobody asked for"))
            return
        call = link.waiting.popleft()
        if call is None:
            return  # a SCRIPT LOAD: a failure shows as NOSCRIPT on the call after it
        if type(reply) is hiredis.ReplyError:
            message = str(reply)
            if message.startswith("NOSCRIPT") and not call.retried:
                sha = call.script.sha
                if link.loaded.get(sha, 0) <= call.batch:  # no load sent after it: load again
                    link.loaded.pop(sha, None)
                self._requeue([call])
                return
            _finish(
                call,
                error=DependencyUnavailable(
                    f"redis ledger script {call.script.name} failed: {message}"
                ),
            )
            return
        call.reply, call.done = reply, True
        future = call.future
        if not future.done():
            future.set_result(None)

    def _requeue(self, calls: list[_Call]) -> None:
        """Send once more, ahead of what is queued (they were written first)."""
        for call in calls:
            call.retried = True
        self._unsent[:0] = calls
        if self._link is not None:
            if not self._flush_due:
                self._flush_due = True
                asyncio.get_running_loop().call_soon(self._flush)
        else:
            self._hand_open()

    def _drop(self, link: _Link) -> list[_Call]:
        """Forget ``link`` and close it; the calls it left unanswered."""
        if link is self._link:
            self._link = None
        link.channel = None
        if link.transport is not None and not link.transport.is_closing():
            link.transport.abort()
        unanswered = [call for call in link.waiting if call is not None and not call.done]
        link.waiting.clear()
        return unanswered

    def _broken(self, link: _Link, exc: BaseException) -> None:
        """The connection broke (a restart, a reset): what it left unanswered is
        sent once more on a new one."""
        if link.channel is not self:
            return
        again: list[_Call] = []
        error = DependencyUnavailable(f"redis ledger call was not answered: {exc!r}")
        for call in self._drop(link):
            if call.retried:
                _finish(call, error=error)
            else:
                again.append(call)
        self._requeue(again)
        self._hand_open()  # calls queued meanwhile need the new connection too

    # --- deadlines -----------------------------------------------------------------------

    def _check_deadlines(self) -> None:
        """Fail the calls whose deadline passed. A written call that is overdue
        means the connection is stuck (a paused server, a partition): it is
        dropped, and every call waiting on it fails (timeouts are not retried)."""
        self._watchdog = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        overdue = [call for call in self._unsent if call.deadline <= now]
        if overdue:
            self._unsent = [call for call in self._unsent if call.deadline > now]
            for call in overdue:
                if call.must_open:  # told to open but not started: another caller will
                    call.must_open = self._opening = False
                _finish(call, error=_timed_out(call, self._timeout_s))
            self._hand_open()
        link = self._link
        if link is not None and any(
            call is not None and call.deadline <= now for call in link.waiting
        ):
            for call in self._drop(link):
                if call.deadline <= now:
                    _finish(call, error=_timed_out(call, self._timeout_s))
                else:
                    _finish(
                        call,
                        error=DependencyUnavailable(
                            "redis ledger call was not answered: the connection was "
                            "dropped after a call timed out"
                        ),
                    )
            self._hand_open()
        pending = [call.deadline for call in self._unsent]
        if self._link is not None:
            pending += [call.deadline for call in self._link.waiting if call is not None]
        if pending:
            self._watchdog = loop.call_at(min(pending), self._check_deadlines)


def _timed_out(call: _Call, timeout_s: float) -> DependencyUnavailable:
    return DependencyUnavailable(
        f"redis ledger script {call.script.name} timed out after {timeout_s:g} s"
    )


def _wake(call: _Call) -> None:
    if not call.future.done():
        call.future.set_result(None)


def _finish(call: _Call, reply: Any = None, error: BaseException | None = None) -> None:
    if call.done:
        return
    call.reply, call.error, call.done = reply, error, True
    _wake(call)
