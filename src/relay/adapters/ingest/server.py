"""``POST /v1/events`` on ``INGEST_ADDR``: events over HTTP, appended to the broker.

Served with aiohttp's web server, below it the webhook's
:class:`~relay.adapters.git.webhook_guard.ConnectionGuard` (connections read at
once, parked, closed at accept; a deadline per connection; bytes per
connection). The checks run in a fixed order so an unauthenticated caller costs
little and learns nothing: over the request cap (429, before a byte of the body
is read), the bearer token (401, body unread), the size (413), the content
(400, :mod:`relay.domain.ingest`), then one ``append`` of every item: 202 with
the ids once it returned (durable), 503 when the broker failed or did not answer
within the deadline. A 503 acknowledges nothing; on Redis part of the batch may
have been appended before the failure (a retry with ``idempotency_key`` adds it
once). Every answer is JSON, errors ``{"error": "<one line>"}``: never a secret,
never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import structlog
from aiohttp import web

from relay.adapters.git.webhook_guard import (
    HEADER_ALLOWANCE,
    ConnectionGuard,
    GuardedEndpoint,
)
from relay.adapters.ingest.tokens import IngestTokens
from relay.application.ports import EventPublisher
from relay.domain.errors import EventError
from relay.domain.events import IngestAnswered
from relay.domain.ingest import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_REQUESTS,
    PATH,
    READ_DEADLINE_S,
    WAITING_CONNECTIONS,
    IngestRefused,
    publications,
)
from relay.domain.messages import DomainEvent
from relay.domain.traceparent import valid_traceparent

_log = structlog.get_logger("relay.ingest")

Reply = tuple[int, dict[str, Any]]


class IngestServer(GuardedEndpoint):
    """The aiohttp app and its lifetime inside the worker's task group."""

    path = PATH
    variable = "INGEST_ADDR"

    def __init__(
        self,
        host: str,
        port: int,
        *,
        publisher: EventPublisher,
        tokens: IngestTokens,
        notify: Callable[[DomainEvent], None],
        max_event_bytes: int,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_requests: int = DEFAULT_MAX_REQUESTS,
        read_deadline_s: float = READ_DEADLINE_S,
        waiting: int = WAITING_CONNECTIONS,
    ) -> None:
        # read twice the request cap at once: the ones over it get their 429
        # instead of a silent wait (memory: limit * (max_body + headers) at most)
        guard = ConnectionGuard(
            limit=2 * max_requests, waiting=waiting, deadline_s=read_deadline_s,
            max_bytes=max_body_bytes + HEADER_ALLOWANCE, label="ingest",
        )
        super().__init__(host, port, guard, max_body_bytes)
        self._publisher = publisher
        self.tokens = tokens
        self._notify = notify
        self._max_event = max_event_bytes
        self._max_requests = max_requests
        self._deadline_s = read_deadline_s
        self.in_flight = 0

    async def bind(self) -> None:
        """Load the token and listen, or raise :class:`RelayError` in one line."""
        await self.tokens.load()
        await super().bind()
        _log.info("ingest_listening", addr=self.addr, path=PATH,
                  authenticated=self.tokens.required,
                  detail=f"HTTP ingest listening on {self.addr}")
        if not self.tokens.required:  # allowed on loopback only (configuration checks it)
            _log.warning("ingest_unauthenticated", addr=self.addr,
                         detail="no INGEST_TOKEN_SECRET: anything on this host can publish")

    async def handle(self, request: web.Request) -> web.Response:
        if self.in_flight >= self._max_requests:
            status, body, events = 429, _error(f"over {self._max_requests} requests at once"), 0
        else:
            self.in_flight += 1
            try:
                (status, body), events = await self._answer(request)
            finally:
                self.in_flight -= 1
        response = web.json_response(body, status=status)
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="relay"'
        elif status in (429, 503):
            response.headers["Retry-After"] = "1"
        response.force_close()  # one request per connection: the guard's deadline is its own
        self._notify(IngestAnswered(status=status, events=events))
        return response

    async def _answer(self, request: web.Request) -> tuple[Reply, int]:
        if not await self.tokens.authorized(request.headers.get("Authorization")):
            return (401, _error("missing or invalid bearer token")), 0
        body = await self._read(request)
        if body is None:
            return (413, _error(f"body over INGEST_MAX_BODY_BYTES ({self._max_body})")), 0
        try:
            # W3C Trace Context over HTTP: the producer's span is every event's parent
            # (a malformed header is ignored, as the recommendation says)
            trace = valid_traceparent(request.headers.get("traceparent"))
            decoded = json.loads(body, parse_constant=_no_constant)
            items = publications(decoded, self._max_event, trace)
        except IngestRefused as exc:
            return (exc.status, _error(str(exc))), 0
        except (ValueError, UnicodeDecodeError, RecursionError):
            return (400, _error("body is not JSON (one item or an array of items)")), 0
        return await self._append(items), len(items)

    async def _read(self, request: web.Request) -> bytes | None:
        """The body, or None when it is over the cap (checked before reading it all)."""
        if request.content_length is not None and request.content_length > self._max_body:
            return None
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            return None

    async def _append(self, items: list[Any]) -> Reply:
        try:
            with anyio.fail_after(self._deadline_s):
                ids = await self._publisher.append(items)
        except (EventError, ValueError) as exc:  # a delivery option the broker refused
            return 400, _error(str(exc))
        except Exception as exc:  # noqa: BLE001 - any broker failure is the same 503
            why = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            _log.warning("ingest_broker_unavailable", error=why[:300], events=len(items))
            return 503, _error("broker unavailable; nothing was acknowledged, retry later")
        return 202, {"ids": ids}


def _no_constant(name: str) -> object:
    # NaN and Infinity are no JSON: a handler's parser would refuse the event
    raise ValueError(name)


def _error(text: str) -> dict[str, Any]:
    return {"error": text}
