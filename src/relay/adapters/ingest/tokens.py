"""Who may ``POST /v1/events``: the operator's bearer token and the handlers' one.

The operator's token is the value of the secret ``INGEST_TOKEN_SECRET`` names,
read from the secret store at start (a missing or blank one refuses the start)
and again at most every ``REFRESH_S`` while requests come, so ``relay secret
set`` rotates it without a restart. A blank stored value would let anyone in
who sends an empty token, so it is refused like a missing one.

Handlers get a token of their own (``RELAY_INGEST_TOKEN``), derived from the
operator's with HMAC-SHA256: a handler that leaks its environment leaks a token
that cannot be turned back into the operator's, that every process of
``relay start --processes N`` derives alike (any of them accepts it), and that
rotates with the operator's. Both are compared in constant time
(``hmac.compare_digest``), always both, so the answer's timing does not say
which one nearly matched.
"""

from __future__ import annotations

import hashlib
import hmac
import time

import anyio
import structlog

from relay.application.ports import SecretStore
from relay.domain.errors import RelayError
from relay.domain.execution import SecretNotFound
from relay.domain.ingest import HANDLER_TOKEN_CONTEXT

_log = structlog.get_logger("relay.ingest")

REFRESH_S = 5.0


class IngestTokens:
    """The accepted tokens; ``secret is None``: an unauthenticated loopback endpoint."""

    def __init__(self, secrets: SecretStore, secret: str | None, *,
                 refresh_s: float = REFRESH_S) -> None:
        self._secrets = secrets
        self.secret = secret
        self._refresh_s = refresh_s
        self._operator: bytes | None = None
        self._handler: bytes | None = None
        self._loaded_at = float("-inf")
        self._lock = anyio.Lock()

    @property
    def required(self) -> bool:
        return self.secret is not None

    async def load(self) -> None:
        """Read the secret now; :class:`RelayError` naming it (never a value)."""
        if self.secret is None:
            return
        value = await anyio.to_thread.run_sync(self._read, self.secret)
        self._operator = value.encode()
        self._handler = handler_token(value).encode()
        self._loaded_at = time.monotonic()

    def _read(self, name: str) -> str:
        try:
            # `echo value | relay secret set` stores a trailing newline no client sends
            value = self._secrets.get(name).rstrip("\r\n")
        except SecretNotFound as exc:
            raise RelayError(
                f"INGEST_TOKEN_SECRET: {exc}; set it with `relay secret set {name}`"
            ) from None
        except (RelayError, OSError) as exc:
            raise RelayError(f"INGEST_TOKEN_SECRET: {exc}") from None
        if not value.strip():
            raise RelayError(
                f'INGEST_TOKEN_SECRET: secret "{name}" is empty or whitespace only; '
                f"set it with `relay secret set {name}`"
            )
        return value

    async def authorized(self, header: str | None) -> bool:
        """Whether ``Authorization: Bearer <token>`` holds an accepted token."""
        if self.secret is None:
            return True
        await self._refresh()
        scheme, _, presented = (header or "").partition(" ")
        given = presented.strip().encode("utf-8", errors="replace")
        operator, handler = self._operator or b"\0", self._handler or b"\0"
        # both compared every time: the timing says nothing about which one
        ok_operator = hmac.compare_digest(given, operator)
        ok_handler = hmac.compare_digest(given, handler)
        return scheme.lower() == "bearer" and bool(given) and (ok_operator or ok_handler)

    async def _refresh(self) -> None:
        if time.monotonic() - self._loaded_at < self._refresh_s:
            return
        async with self._lock:
            if time.monotonic() - self._loaded_at < self._refresh_s:
                return  # another request refreshed meanwhile
            try:
                await self.load()
            except RelayError as exc:
                # nobody is let in on a token that may have been revoked
                self._operator = self._handler = None
                self._loaded_at = time.monotonic()
                _log.error("ingest_token_unavailable", secret=self.secret, error=str(exc))

    def handler_env_token(self) -> str | None:
        """The handlers' token as last loaded (None: none is required, or unreadable)."""
        return self._handler.decode() if self._handler is not None else None


def handler_token(operator_token: str) -> str:
    """The handlers' token derived from the operator's (see the module doc)."""
    key = operator_token.encode()
    return hmac.new(key, HANDLER_TOKEN_CONTEXT, hashlib.sha256).hexdigest()
