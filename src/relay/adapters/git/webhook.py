"""``POST /github`` on ``GIT_WEBHOOK_ADDR``: GitHub push deliveries schedule a sync.

Served with aiohttp's web server. The order of checks is fixed so an
unauthenticated caller learns nothing: size (413), signature when a webhook
secret is configured (401; the secret is read from the secret store on every
delivery, so ``relay secret set`` rotates it without a restart; a blank stored
value is an empty HMAC key anyone can sign with, so it is refused like a missing
one, 500), JSON (400, a body nested too deep to parse included), then the event
filter (200, ignored) and the delivery id (200, duplicate). Only then is a sync
*requested* (202): the handler never runs a sync itself. Below the handler,
:mod:`webhook_guard` bounds connections, their bytes and their time.

The delivery id is remembered only once accepted, so GitHub's "Redeliver" of a
delivery that failed here is not mistaken for a duplicate.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import anyio
import structlog
from aiohttp import web

from relay.adapters.git.files import GitPaths
from relay.adapters.git.store import GitStore
from relay.adapters.git.webhook_guard import (
    HEADER_ALLOWANCE,
    ConnectionGuard,
    GuardedEndpoint,
)
from relay.application.bus import Send
from relay.application.git_sync import SyncScheduler
from relay.application.ports import SecretStore
from relay.domain.errors import RelayError
from relay.domain.events import GitWebhookDelivered
from relay.domain.git import (
    MAX_WEBHOOK_BODY_BYTES,
    MAX_WEBHOOK_CONNECTIONS,
    MAX_WEBHOOK_WAITING,
    WEBHOOK_READ_DEADLINE_S,
    DeliveryOutcome,
    GitSource,
    push_decision,
    signature_valid,
)
from relay.domain.messages import DomainEvent

_log = structlog.get_logger("relay.git")

PATH = "/github"
REMEMBERED_DELIVERIES = 1024

Notify = Callable[[DomainEvent], None]


class WebhookServer(GuardedEndpoint):
    """The aiohttp app and its lifetime inside the worker's task group."""

    path = PATH
    variable = "GIT_WEBHOOK_ADDR"

    def __init__(
        self,
        host: str,
        port: int,
        *,
        source: GitSource,
        secrets: SecretStore,
        request_sync: Callable[[], None],
        notify: Notify,
        max_body_bytes: int = MAX_WEBHOOK_BODY_BYTES,
        max_connections: int = MAX_WEBHOOK_CONNECTIONS,
        max_waiting: int = MAX_WEBHOOK_WAITING,
        read_deadline_s: float = WEBHOOK_READ_DEADLINE_S,
    ) -> None:
        guard = ConnectionGuard(
            limit=max_connections, waiting=max_waiting, deadline_s=read_deadline_s,
            max_bytes=max_body_bytes + HEADER_ALLOWANCE,
        )
        super().__init__(host, port, guard, max_body_bytes)
        self.source = source
        self._secrets = secrets
        self._request_sync = request_sync
        self._notify = notify
        self._accepted: OrderedDict[str, None] = OrderedDict()

    async def bind(self) -> None:
        """Listen, or raise :class:`RelayError` in one line (a taken port is fatal)."""
        await super().bind()
        _log.info("git_webhook_listening", addr=self.addr, path=PATH,
                  detail=f"Webhook http server listening on {self.addr}")
        if self.source.webhook_secret is None:
            _log.warning(
                "git_webhook_unauthenticated", addr=self.addr,
                detail="no --webhook-secret is configured: the endpoint is unauthenticated "
                "and anyone who can reach it can trigger a sync",
            )

    async def handle(self, request: web.Request) -> web.Response:
        answered, response = await self._answer(request)
        outcome = answered.value  # the plain text in the event, the metric and the log
        response.force_close()  # one request per connection: the guard's deadline is its own
        self._notify(GitWebhookDelivered(outcome=outcome))
        _log.info(
            "git_webhook_delivery", outcome=outcome, status=response.status,
            github_event=request.headers.get("X-GitHub-Event", "-"),
            delivery=request.headers.get("X-GitHub-Delivery", "-"),
        )
        return response

    async def _read(self, request: web.Request) -> bytes | None:
        """The body, or None when it is over the cap (checked before reading it all)."""
        if request.content_length is not None and request.content_length > self._max_body:
            return None
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            return None

    async def _answer(self, request: web.Request) -> tuple[DeliveryOutcome, web.Response]:
        body = await self._read(request)
        if body is None:
            return DeliveryOutcome.TOO_LARGE, _reply(413, f"body over {self._max_body} bytes")
        if self.source.webhook_secret is not None:
            refused = await self._check_signature(body, request)
            if refused is not None:
                return refused
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return DeliveryOutcome.MALFORMED, _reply(400, "body is not JSON")
        decision = push_decision(request.headers.get("X-GitHub-Event"), payload, self.source)
        if not decision.schedule:
            return DeliveryOutcome.IGNORED, _reply(200, decision.reason)
        delivery = request.headers.get("X-GitHub-Delivery", "")
        if delivery and delivery in self._accepted:
            answer = _reply(200, "delivery already accepted; no second sync")
            return DeliveryOutcome.DUPLICATE, answer
        if delivery:
            self._accepted[delivery] = None
            while len(self._accepted) > REMEMBERED_DELIVERIES:
                self._accepted.popitem(last=False)
        self._request_sync()
        return DeliveryOutcome.ACCEPTED, _reply(202, "sync scheduled")

    async def _check_signature(
        self, body: bytes, request: web.Request
    ) -> tuple[DeliveryOutcome, web.Response] | None:
        name = self.source.webhook_secret
        assert name is not None
        try:
            secret = await anyio.to_thread.run_sync(self._secrets.get, name)
        except (RelayError, OSError) as exc:
            # the reason names the secret, never a value
            _log.error("git_webhook_secret_unavailable", secret=name, error=str(exc))
            return DeliveryOutcome.UNAVAILABLE, _reply(500, "webhook secret unavailable")
        # `echo value | relay secret set` stores a trailing newline GitHub never signs with
        secret = secret.rstrip("\r\n")
        if not secret.strip():
            # an empty HMAC key: anyone could sign with it, so nobody is let in
            _log.error("git_webhook_secret_unavailable", secret=name,
                       error=f'secret "{name}" is empty or whitespace only; '
                       f"set it with `relay secret set {name}`")
            return DeliveryOutcome.UNAVAILABLE, _reply(500, "webhook secret unavailable")
        if not signature_valid(secret, body, request.headers.get("X-Hub-Signature-256")):
            answer = _reply(401, "missing or invalid X-Hub-Signature-256")
            return DeliveryOutcome.UNAUTHORIZED, answer
        return None


def _reply(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n")


def git_webhook(
    *,
    host: str,
    port: int,
    state_dir: Path,
    secrets: SecretStore,
    send: Send,
    emit: Notify,
) -> tuple[SyncScheduler, WebhookServer] | None:
    """The scheduler and the server when a git source is configured; None (with
    the reason logged) otherwise. ``GIT_WEBHOOK_ADDR`` itself is checked by the
    caller. The scheduler sends ``SyncGit`` (``send``): the worker's one sync handler."""
    paths = GitPaths(state_dir)
    try:
        source = GitStore(paths).load_source()
    except RelayError as exc:
        _log.error("git_webhook_disabled", reason=str(exc))
        return None
    if source is None:
        _log.info("git_webhook_disabled",
                  reason="no git source is configured (relay git set); nothing is bound")
        return None

    scheduler = SyncScheduler(send)
    server = WebhookServer(host, port, source=source, secrets=secrets,
                           request_sync=scheduler.request, notify=emit)
    return scheduler, server
