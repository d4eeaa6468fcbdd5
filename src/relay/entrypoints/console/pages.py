"""The console's routes: server-rendered pages (Jinja2, autoescaped) and their POSTs.

Reads run in worker threads or on the broker's async client; every POST changes
state only after the security middleware checked its CSRF token. A bad query
value (an unknown outcome, a malformed id) is one line on the page, never a
traceback, and never a secret value: the pages show secret NAMES only.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import jinja2
from aiohttp import web

from relay.adapters.sqlite.db import StateDatabase
from relay.adapters.sqlite.run_history import RunHistory, recent_runs, run_names
from relay.application.registry import FunctionRegistry
from relay.domain import run_history as rh
from relay.domain.dlq_selection import Selection
from relay.domain.errors import RelayError
from relay.domain.execution import PoolSnapshot
from relay.domain.retention import StreamId
from relay.entrypoints.cli.dlq import describe, relative_age
from relay.entrypoints.cli.trace_render import render_trace
from relay.entrypoints.console import views
from relay.entrypoints.console.reads import ConsoleReads
from relay.entrypoints.console.replays import ReplayQueue
from relay.entrypoints.console.security import AUTH_COOKIE, Access, session_of

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
BACKLOG_DEADLINE_S = 2.0
MAX_LISTED = 200
UNAVAILABLE = (RelayError, OSError, sqlite3.Error)
"""What a broker read raises when the broker is down (Redis errors arrive as
``DependencyUnavailable``); a page says so in one line."""
OVERVIEW_TTL_S = 1.0
"""The overview's figures are reused this long (the run history flushes every 1 s)."""


@dataclass
class Console:
    """Everything the pages read from."""

    reads: ConsoleReads
    history: RunHistory
    db: StateDatabase
    registry: FunctionRegistry
    breakers: views.Breakers
    replays: ReplayQueue
    access: Access
    pools: Callable[[], dict[str, PoolSnapshot]] = dict
    templates: jinja2.Environment = field(default_factory=lambda: jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
        undefined=jinja2.StrictUndefined,
    ))
    _overview: tuple[float, dict[str, Any]] | None = field(default=None, init=False)

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/", self.overview)
        app.router.add_get("/functions", self.functions)
        app.router.add_get("/runs", self.runs)
        app.router.add_get("/trace/{message_id}", self.trace)
        app.router.add_get("/dlq", self.dead_letters)
        app.router.add_get("/dlq/{entry_id}", self.dead_letter)
        app.router.add_post("/dlq/replay", self.replay)
        app.router.add_post("/dlq/remove", self.remove)
        app.router.add_get("/login", self.login_form)
        app.router.add_post("/login", self.login)
        app.router.add_static("/static/", STATIC, append_version=False)

    def _page(self, request: web.Request, name: str, status: int = 200,
              **values: Any) -> web.Response:
        template = self.templates.get_template(name)
        text = template.render(
            csrf=self.access.csrf_for(session_of(request)), path=request.path,
            signed=self.access.token_secret is not None, **values,
        )
        return web.Response(status=status, text=text, content_type="text/html")

    def _unavailable(self, request: web.Request, title: str, exc: Exception) -> web.Response:
        """503 and one line: the broker is down or the file unreadable (no traceback)."""
        line = " ".join(str(exc).split())[:300]
        return self._page(request, "message.html", status=503, title=title,
                          text=f"cannot read from the broker: {line}")

    async def _blocking(self, action: Any, *args: Any) -> Any:
        return await anyio.to_thread.run_sync(action, *args)

    # --- pages -----------------------------------------------------------------
    async def overview(self, request: web.Request) -> web.Response:
        values = await self._overview_values()
        return self._page(
            request, "overview.html", **values, breakers=self.breakers.open,
            broker=self.reads.broker_name, dropped=self.history.dropped,
        )

    async def _overview_values(self) -> dict[str, Any]:
        """The charts, totals and backlog, read at most once per ``OVERVIEW_TTL_S``:
        the rollups change once a flush anyway, and a dashboard left open (or 50
        requests/s of them) must not cost the worker a query and a chart per request."""
        cached = self._overview
        if cached is not None and time.monotonic() - cached[0] < OVERVIEW_TTL_S:
            return cached[1]
        charts = await self._blocking(views.overview_charts, self.db)
        hour = await self._blocking(views.totals, self.db)
        pending, oldest, delayed = None, None, None
        with anyio.move_on_after(BACKLOG_DEADLINE_S), suppress(*UNAVAILABLE):
            pending, oldest, delayed = await self.reads.backlog()
        values = {"charts": charts, "hour": hour, "pending": pending, "delayed": delayed,
                  "oldest": None if oldest is None else f"{oldest:.1f}s"}
        self._overview = (time.monotonic(), values)
        return values

    async def functions(self, request: web.Request) -> web.Response:
        rows = await self._blocking(
            views.function_rows, self.db, self.registry, self.breakers, time.time(),
            self.pools(),
        )
        return self._page(request, "functions.html", functions=rows)

    async def runs(self, request: web.Request) -> web.Response:
        q = request.query
        function, handler, outcome = (q.get(k) or None for k in ("function", "handler", "outcome"))
        problem = None
        if outcome is not None and outcome not in rh.OUTCOMES:
            problem = f"unknown outcome {outcome[:40]!r}: one of {', '.join(rh.OUTCOMES)}"
            outcome = None
        found = await self._blocking(
            lambda: recent_runs(self.db, function=function, handler=handler, outcome=outcome,
                                limit=MAX_LISTED)
        )
        functions, handlers = await self._blocking(run_names, self.db)
        return self._page(
            request, "runs.html", runs=[_run_view(r) for r in found], problem=problem,
            chosen={"function": function or "", "handler": handler or "", "outcome": outcome or ""},
            functions=functions, handlers=handlers, outcomes=rh.OUTCOMES,
            query=request.query_string,  # htmx refreshes the table with the same filter
        )

    async def trace(self, request: web.Request) -> web.Response:
        raw = request.match_info["message_id"]
        try:
            message_id = str(StreamId.parse(raw.strip()))
        except ValueError:
            return self._page(request, "message.html", status=400, title="Trace",
                              text=f"{raw[:60]!r} is not a stream message id")
        try:
            facts = await self.reads.trace(message_id)
        except UNAVAILABLE as exc:
            return self._unavailable(request, "Trace", exc)
        return self._page(request, "trace.html", message_id=message_id,
                          lines=render_trace(facts))

    async def dead_letters(self, request: web.Request) -> web.Response:
        q = request.query
        chosen = Selection(
            function=q.get("function") or None, handler=q.get("handler") or None,
            reason=q.get("reason") or None, limit=MAX_LISTED,
        )
        try:
            found = await self.reads.dead_letters(chosen)
        except UNAVAILABLE as exc:
            return self._unavailable(request, "Dead letters", exc)
        now = time.time()
        entries = [{
            "id": s.id, "original_id": s.entry.original_id, "function": s.entry.function,
            "handler": s.entry.handler, "attempts": s.entry.handler_attempts,
            "reason": s.entry.reason, "age": relative_age(now - s.created_ms / 1000),
            "replayable": s.replayable,
        } for s in found.entries]
        return self._page(
            request, "dlq.html", entries=entries, total=found.total, matched=found.matched,
            chosen={k: q.get(k, "") for k in ("function", "handler", "reason")},
            waiting=self.replays.waiting, outcomes=list(self.replays.outcomes),
            notice=q.get("notice", "")[:200],
        )

    async def dead_letter(self, request: web.Request) -> web.Response:
        entry_id = request.match_info["entry_id"]
        try:
            stored = await self.reads.dead_letter(entry_id)
        except RelayError as exc:
            return self._page(request, "message.html", status=404, title="Dead letter",
                              text=str(exc)[:300])
        return self._page(request, "dlq_entry.html", entry_id=stored.id,
                          replayable=stored.replayable,
                          lines=describe(stored, now=time.time()))

    # --- state-changing POSTs (CSRF checked by the middleware) ------------------
    async def replay(self, request: web.Request) -> web.Response:
        ids = _ids(await request.post())
        queued = self.replays.add(ids)
        return see_other(f"/dlq?notice=queued+{queued}+replay(s)")

    async def remove(self, request: web.Request) -> web.Response:
        form = await request.post()
        ids = _ids(form)
        if form.get("confirm") != "yes":
            return self._page(request, "confirm.html", ids=ids)
        removed = await self.reads.remove(ids)
        return see_other(f"/dlq?notice=removed+{removed}+entr(y/ies)")

    async def login_form(self, request: web.Request) -> web.Response:
        return self._page(request, "login.html", problem=None)

    async def login(self, request: web.Request) -> web.Response:
        if self.access.token_secret is None:
            return see_other("/")
        form = await request.post()
        cookie = await self.access.check_token(str(form.get("token", "")))
        if cookie is None:
            return self._page(request, "login.html", status=401, problem="wrong token")
        response = see_other("/")
        response.set_cookie(AUTH_COOKIE, cookie, httponly=True, samesite="Strict", path="/")
        return response


def see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _ids(form: Any) -> list[str]:
    return [str(v)[:40] for v in form.getall("id", [])][:MAX_LISTED]


def _run_view(run: rh.Run) -> dict[str, Any]:
    return {
        "at": datetime.fromtimestamp(run.at, UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "function": run.function, "handler": run.handler, "outcome": run.outcome,
        "duration": f"{run.duration_s * 1000:.0f} ms", "message_id": run.message_id,
        "attempt": run.attempt, "error": run.error, "kind": run.kind,
    }

