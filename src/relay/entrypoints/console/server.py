"""The web console on ``CONSOLE_ADDR`` (opt-in), inside the worker's process.

Served by aiohttp below the same connection guard as the git webhook
(:mod:`relay.adapters.git.webhook_guard`): at most ``MAX_CONNECTIONS`` requests
are read at once (more wait, reading paused; beyond that they are closed), each
connection has ``READ_DEADLINE_S`` from accept to finish and may send at most the
body cap plus headers; every answer closes its connection. The console never
takes part in delivery: it reads the run history, the state database and the
broker, and its only actions (replay, remove) are the CLI's.
"""

from __future__ import annotations

import sqlite3
from typing import Any, cast

import anyio
import structlog
from aiohttp import web
from anyio.abc import TaskStatus

from relay.adapters.git.webhook_guard import (
    HEADER_ALLOWANCE,
    ConnectionGuard,
    close_runner,
    listen_guarded,
)
from relay.adapters.sqlite.run_history import open_history_db
from relay.domain.errors import RelayError
from relay.entrypoints.console.pages import Console
from relay.entrypoints.console.reads import ConsoleReads
from relay.entrypoints.console.replays import ReplayQueue
from relay.entrypoints.console.security import Access, guard
from relay.entrypoints.console.views import Breakers

_log = structlog.get_logger("relay.console")

MAX_BODY_BYTES = 64 * 1024
MAX_CONNECTIONS = 32
MAX_WAITING = 64
READ_DEADLINE_S = 10.0


class ConsoleServer:
    """Binds in :meth:`bind` (a taken port or a missing token fails start-up in one
    line), serves in :meth:`run` until cancelled."""

    def __init__(
        self,
        console: Console,
        host: str,
        port: int,
        *,
        max_connections: int = MAX_CONNECTIONS,
        max_waiting: int = MAX_WAITING,
        read_deadline_s: float = READ_DEADLINE_S,
    ) -> None:
        self.console = console
        self.host = host
        self.port = port
        self.bound_port: int | None = None
        self.guard = ConnectionGuard(
            limit=max_connections, waiting=max_waiting, deadline_s=read_deadline_s,
            max_bytes=MAX_BODY_BYTES + HEADER_ALLOWANCE,
        )
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES,
                              middlewares=[cast("Any", guard(self.console.access))])
        self.console.routes(app)
        return app

    async def bind(self) -> None:
        access = self.console.access
        if access.token_secret is not None:
            try:
                await access.token()
            except (RelayError, OSError) as exc:
                raise RelayError(f"CONSOLE_TOKEN_SECRET: {exc}") from exc
        self._runner, self.bound_port = await listen_guarded(
            self.app(), self.host, self.port, self.guard, "CONSOLE_ADDR"
        )
        _log.info("console_listening", addr=f"{self.host}:{self.bound_port}",
                  token=access.token_secret is not None)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(self.console.replays.run)
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                runner, self._runner = self._runner, None
                await close_runner(runner)
                self.console.db.close()


async def add_console(worker: Any, settings: Any) -> ConsoleServer | None:
    """Bind the console when ``CONSOLE_ADDR`` is set and add it to the worker's loops."""
    console_settings = settings.observe.console
    if not console_settings.enabled or worker.parts is None:
        return None
    parts = worker.parts
    breakers = Breakers()
    breakers.subscribe(worker.bus)
    try:
        db = await anyio.to_thread.run_sync(open_history_db, settings.paths.database)
    except (sqlite3.Error, OSError) as exc:
        raise RelayError(f"CONSOLE_ADDR: cannot open the state database"
                         f" {settings.paths.database}: {exc}") from exc
    console = Console(
        reads=ConsoleReads(parts.broker, stream=settings.redis.stream,
                           group=settings.redis.group),
        history=parts.history, db=db, registry=worker.registry, breakers=breakers,
        replays=ReplayQueue(worker.bus.send),
        access=Access(parts.secrets, console_settings.token_secret), pools=parts.pools,
    )
    server = ConsoleServer(console, console_settings.host, console_settings.port)
    try:
        await server.bind()
    except RelayError:
        db.close()
        raise
    worker.loops.append(("console", server.run))
    return server
