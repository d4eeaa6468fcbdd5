"""Who may use the console, and which POSTs are the console's own.

- **Token** (only when bound beyond loopback): the value of the secret
  ``CONSOLE_TOKEN_SECRET`` names, read from the secret store on each check (so
  ``relay secret set`` rotates it without a restart). A browser signs in once on
  ``/login`` and gets a cookie holding an HMAC of the token under a per-process
  key (never the token itself); a script sends ``Authorization: Bearer <token>``.
  Anything else is 401 before a page is read.
- **CSRF**: every state-changing request is a POST whose form carries
  ``csrf``, an HMAC of the browser's session cookie under the same key; a POST
  without it, or with another session's, is 403 and does nothing.
- Every answer forbids framing, sniffing, referrers and any script but the
  console's own files (a Content-Security-Policy).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable

import anyio.to_thread
import structlog
from aiohttp import web

from relay.application.ports import SecretStore
from relay.domain.errors import RelayError

_log = structlog.get_logger("relay.console")

SESSION_COOKIE = "relay_console_session"
AUTH_COOKIE = "relay_console_auth"
CSRF_FIELD = "csrf"
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline';"
        " img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

SESSION: web.RequestKey[str] = web.RequestKey("session", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Access:
    """The token check (None: loopback, no token) and the CSRF tokens."""

    def __init__(self, secrets_store: SecretStore, token_secret: str | None) -> None:
        self._secrets = secrets_store
        self.token_secret = token_secret
        self._key = secrets.token_bytes(32)

    def _mac(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    def csrf_for(self, session: str) -> str:
        return self._mac("csrf:" + session)

    def csrf_valid(self, session: str, presented: str) -> bool:
        return bool(session) and hmac.compare_digest(self.csrf_for(session), presented)

    async def token(self) -> str:
        """The current token; a ``RelayError`` naming the secret (never its value)."""
        assert self.token_secret is not None
        value = await anyio.to_thread.run_sync(self._secrets.get, self.token_secret)
        value = value.strip()
        if not value:
            raise RelayError(f'CONSOLE_TOKEN_SECRET: secret "{self.token_secret}" is empty;'
                             f" set it with `relay secret set {self.token_secret}`")
        return value

    def auth_cookie(self, token: str) -> str:
        return self._mac("auth:" + token)

    async def signed_in(self, request: web.Request) -> bool:
        if self.token_secret is None:
            return True
        token = await self.token()
        bearer = request.headers.get("Authorization", "")
        if bearer.startswith("Bearer ") and hmac.compare_digest(
            bearer.removeprefix("Bearer ").strip().encode(), token.encode()
        ):
            return True
        cookie = request.cookies.get(AUTH_COOKIE, "")
        return bool(cookie) and hmac.compare_digest(cookie, self.auth_cookie(token))

    async def check_token(self, presented: str) -> str | None:
        """The cookie value for a correct token, else None."""
        token = await self.token()
        if hmac.compare_digest(presented.strip().encode(), token.encode()):
            return self.auth_cookie(token)
        return None


def session_of(request: web.Request) -> str:
    """The browser's session id (a new one is set on the answer when missing)."""
    found: str = request.get(SESSION, "")
    return found


def guard(access: Access) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The middleware: session cookie, token, CSRF, and the security headers."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        session = request.cookies.get(SESSION_COOKIE, "")
        fresh = not (len(session) == 64 and session.isalnum())
        if fresh:
            session = secrets.token_hex(32)
        request[SESSION] = session
        try:
            response = await _checked(access, request, handler, session)
        except web.HTTPException as exc:  # aiohttp's own (404, 405, 413): an answer like ours
            response = web.Response(status=exc.status, text=exc.text or exc.reason)
        response.force_close()  # one request per connection: the guard's deadline is its own
        if fresh:
            response.set_cookie(SESSION_COOKIE, session, httponly=True, samesite="Strict",
                                path="/")
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    return middleware


async def _checked(
    access: Access, request: web.Request, handler: Handler, session: str
) -> web.StreamResponse:
    open_path = request.path == "/login" or request.path.startswith("/static/")
    try:
        allowed = open_path or await access.signed_in(request)
    except (RelayError, OSError) as exc:
        _log.error("console_token_unavailable", secret=access.token_secret, error=str(exc))
        return web.Response(status=503, text="console token unavailable; see the worker log\n")
    if not allowed:
        return web.Response(
            status=401, content_type="text/html",
            text='<!doctype html><title>Sign in</title><p>This console needs its access token:'
                 ' <a href="/login">sign in</a>.</p>',
        )
    if request.method == "POST":
        form = await request.post()
        if not access.csrf_valid(session, str(form.get(CSRF_FIELD, ""))):
            return web.Response(status=403, text="missing or invalid CSRF token; reload the page\n")
    return await handler(request)
