"""What the internet may cost the worker through ``GIT_WEBHOOK_ADDR``.

Every connection is unauthenticated until its whole body is read and its
signature checked, so the bound is put on connections, below aiohttp:

- at most ``limit`` requests are read at once; up to ``waiting`` more
  connections wait their turn with reading paused (a socket, no memory of ours:
  uvloop starts reading after ``connection_made``, so reading is paused again
  before its first read, and a chunk that slips through is held and counted),
  and one beyond those is closed at accept, before a byte of it is read;
- a connection gets ``deadline_s`` from accept to finish: headers, body and the
  answer (GitHub itself gives up after 10 s), then it is aborted, so a stalled
  or trickling client holds its slot for at most that long;
- a connection may send at most ``max_bytes`` (the body cap plus room for the
  headers); bytes beyond it are dropped unread (aiohttp has answered 413 by then,
  and that answer still reaches the client before the connection closes).

Memory held for request bytes is therefore at most ``limit * max_bytes``
whatever is sent; :attr:`ConnectionGuard.buffered` is that accounting, and the
peaks are kept so a test can assert them. The deadline runs from accept, so a
waiting connection spends its wait from its own 10 s.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import cast

import anyio
import structlog
from aiohttp import web
from anyio.abc import TaskStatus

from relay.domain.errors import RelayError

_log = structlog.get_logger("relay.git")

HEADER_ALLOWANCE = 64 * 1024
"""Room for the request line and headers on top of the body cap (a GitHub
delivery's headers are about 1 KiB; aiohttp's own field limit is 8 KiB)."""


class ConnectionGuard:
    """Counts, caps and times out the webhook's connections."""

    def __init__(self, *, limit: int, waiting: int, deadline_s: float, max_bytes: int,
                 label: str = "git_webhook") -> None:
        self.label = label  # the log events' prefix: the ingest endpoint reuses the guard
        self.limit = limit
        self.waiting_limit = waiting
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes
        self.active = 0
        self.buffered = 0
        self.peak_active = 0
        self.peak_buffered = 0
        self.refused = 0
        self.timed_out = 0
        self.oversized = 0
        self._waiting: deque[_GuardedProtocol] = deque()
        self._full = False

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _GuardedProtocol(self, factory)

    def admit(self, conn: _GuardedProtocol) -> bool:
        """Start ``conn`` now, park it (reading paused) or refuse it (False)."""
        if self.active < self.limit:
            self._start(conn)
            return True
        if len(self._waiting) < self.waiting_limit:
            self._waiting.append(conn)
            return True
        self.refused += 1
        if not self._full:  # one line per saturation, not one per connection
            self._full = True
            _log.warning(f"{self.label}_busy", limit=self.limit, waiting=self.waiting_limit,
                         detail=f"{self.limit} requests are being read and "
                         f"{self.waiting_limit} connections wait; further ones are closed")
        return False

    def _start(self, conn: _GuardedProtocol) -> None:
        self.active += 1
        self.peak_active = max(self.peak_active, self.active)
        conn.start()

    def received(self, count: int) -> None:
        self.buffered += count
        self.peak_buffered = max(self.peak_buffered, self.buffered)

    def release(self, conn: _GuardedProtocol, started: bool, count: int) -> None:
        self.buffered -= count
        if not started:
            self._waiting.remove(conn)
            return
        self.active -= 1
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.closing:  # one the deadline just cut is not started
                self._start(waiter)
                return
            waiter.drop()
        self._full = False


class _GuardedProtocol(asyncio.Protocol):
    """Sits between the event loop and aiohttp's protocol for one connection; the
    inner protocol is made only once the connection may be read."""

    def __init__(self, guard: ConnectionGuard, factory: Callable[[], asyncio.Protocol]) -> None:
        self._guard = guard
        self._factory = factory
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._admitted = False
        self._received = 0
        self._held = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a cast, not an isinstance check: uvloop's TCP transport (what `relay start`
        # runs on) has the Transport methods without subclassing asyncio.Transport
        self._transport = cast("asyncio.Transport", transport)
        self._transport.pause_reading()  # nothing is read before the guard says so
        if not self._guard.admit(self):
            self._transport.abort()
            return
        self._admitted = True
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._guard.deadline_s, self._expire)
        if self._inner is None:
            # uvloop starts reading right after connection_made returns: pause again
            # before its first read (data that slips through is held, see below)
            loop.call_soon(self._hold)

    def _hold(self) -> None:
        if self._inner is None and self._transport is not None and not self.closing:
            self._transport.pause_reading()

    @property
    def closing(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    def drop(self) -> None:
        """Forgotten by the guard before it started; its close is still to come."""
        self._admitted = False
        self._guard.buffered -= self._received
        self._received, self._held = 0, b""
        if self._timer is not None:
            self._timer.cancel()

    def start(self) -> None:
        assert self._transport is not None
        self._inner = self._factory()
        self._inner.connection_made(self._transport)
        held, self._held = self._held, b""
        if held:
            self._inner.data_received(held)
        self._transport.resume_reading()

    def _expire(self) -> None:
        self._guard.timed_out += 1
        _log.info(f"{self._guard.label}_timeout", deadline_s=self._guard.deadline_s,
                  detail="a connection did not finish its request in time; closed")
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._inner is None:  # read before the guard started this connection
            self._hold()
            if self._admitted:
                kept = data[: self._guard.max_bytes - self._received]
                self._held += kept
                self._received += len(kept)
                self._guard.received(len(kept))
            return
        room = self._guard.max_bytes - self._received
        if room <= 0:
            return
        if len(data) > room:
            self._guard.oversized += 1
            data = data[:room]
        self._received += len(data)
        self._guard.received(len(data))
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        if self._timer is not None:
            self._timer.cancel()
        inner, self._inner = self._inner, None
        self._guard.release(self, inner is not None, self._received)
        if inner is not None:
            inner.connection_lost(exc)


class GuardedSite(web.TCPSite):
    """aiohttp's TCP site with every accepted connection passed through a guard."""

    __slots__ = ("_guard",)

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int,
                 guard: ConnectionGuard) -> None:
        super().__init__(runner, host, port)
        self._guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.wrap(server), self._host, self._port, backlog=self._backlog,
        )


async def listen_guarded(
    app: web.Application, host: str | None, port: int, guard: ConnectionGuard, variable: str
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port`` behind ``guard``: the runner and the port bound
    (the one asked for, or the one the system chose for 0), or :class:`RelayError`
    in one line naming ``variable`` when it cannot listen (a taken port is fatal
    at start-up). ``handler_cancellation``: a request whose connection the guard
    cut ends there, instead of logging the lost connection as a server error."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False,
                           handler_cancellation=True)
    await runner.setup()
    site = GuardedSite(runner, host or None, port, guard)
    try:
        await site.start()
    except OSError as exc:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
        raise RelayError(
            f"{variable} {host}:{port}: cannot listen "
            f"({exc.strerror or exc}); is another process using the port?"
        ) from exc
    addresses = runner.addresses  # (host, port, ...) of every bound socket
    return runner, int(addresses[0][1]) if addresses else port


async def close_runner(runner: web.AppRunner | None) -> None:
    """Stop serving: shielded and bounded (a graceful stop must not hang on it)."""
    if runner is not None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await runner.cleanup()


class GuardedEndpoint:
    """One POST endpoint behind a :class:`ConnectionGuard` (the git webhook, HTTP
    ingest): binding, serving and closing, shared. A subclass sets ``path`` and
    ``variable`` (the setting named in a bind error), implements ``handle``, and
    may extend :meth:`bind` (load a token first, log what it listens on)."""

    path = "/"
    variable = "ADDR"

    def __init__(self, host: str, port: int, guard: ConnectionGuard, max_body_bytes: int) -> None:
        self.host = host
        self.port = port
        self.guard = guard
        self._max_body = max_body_bytes
        self.bound_port: int | None = None
        self._runner: web.AppRunner | None = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.bound_port or self.port}"

    def app(self) -> web.Application:
        # client_max_size + 1 so that exactly max_body bytes still read; more is 413
        app = web.Application(client_max_size=self._max_body + 1)
        app.router.add_post(self.path, self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        raise NotImplementedError

    async def bind(self) -> None:
        """Listen, or raise :class:`RelayError` in one line (a taken port is fatal)."""
        self._runner, self.bound_port = await listen_guarded(
            self.app(), self.host, self.port, self.guard, self.variable
        )

    async def aclose(self) -> None:
        runner, self._runner = self._runner, None
        await close_runner(runner)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; binds first unless :meth:`bind` already did (the
        worker binds during start-up, so a taken port fails it in one line)."""
        owned = self._runner is None
        if owned:
            await self.bind()
        task_status.started()
        try:
            await anyio.sleep_forever()
        finally:
            if owned:
                await self.aclose()
