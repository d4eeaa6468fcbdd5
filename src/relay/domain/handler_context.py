"""What one invocation tells its handler about itself: the ``RELAY_*`` variables.

A warm container serves many invocations, so these are per-invocation
variables: they travel in each request's ``env`` (beside ``RELAY_HANDLER``) on
every path to the bootstrap, and the bootstrap sets them for that one run only.
The payload on stdin stays exactly the event (or an occurrence's payload).

- ``RELAY_MESSAGE_ID``: the stream entry id the invocation handles. The same
  for every attempt, every redelivery and a ``relay dlq replay`` of it: the key
  an idempotent handler stores. ``relay function invoke`` has no message: it
  gets ``invoke-<random>``, one per command, never a stream id's shape.
- ``RELAY_ATTEMPT``: 1 for the first attempt, counted by the ledger (a
  redelivery after a crash continues the count). A replay is one past the
  attempts its dead letter records; ``relay function invoke`` is 1.
- ``RELAY_DEADLINE``: the instant (RFC 3339, UTC, milliseconds, rounded down)
  when the handler's timeout elapses: Relay stops waiting then and discards the
  container. It is the timeout, not the claim's lease end: the lease is renewed
  to outlast the timeout, so the timeout is the earlier bound, the one that ends
  the handler.
- ``RELAY_OCCURRENCE_ID``: a schedule occurrence's id
  (``schedule:<function>:<handler>:<instant>``); absent for events.
- ``TRACEPARENT`` (W3C Trace Context, the name OpenTelemetry SDKs read): the
  invocation span's context when Relay traces, so the handler's own spans join
  the trace; else the producer's ``traceparent`` unchanged; absent when neither.
- ``RELAY_INGEST_URL`` and ``RELAY_INGEST_TOKEN``: where and how the handler
  posts follow-up events (HTTP ingest, ``docs/producing.md``), when the worker
  has ``INGEST_HANDLER_URL``; the worker's, the same for every invocation
  (:func:`ingest_env`; the runtime adds them to each request).
"""

from __future__ import annotations

import functools
import math
from datetime import UTC, datetime
from typing import Final

import msgspec

ENV_HANDLER: Final = "RELAY_HANDLER"
ENV_MESSAGE_ID: Final = "RELAY_MESSAGE_ID"
ENV_ATTEMPT: Final = "RELAY_ATTEMPT"
ENV_DEADLINE: Final = "RELAY_DEADLINE"
ENV_OCCURRENCE_ID: Final = "RELAY_OCCURRENCE_ID"
ENV_TRACEPARENT: Final = "TRACEPARENT"
ENV_INGEST_URL: Final = "RELAY_INGEST_URL"
ENV_INGEST_TOKEN: Final = "RELAY_INGEST_TOKEN"  # noqa: S105 - a variable's name
# Relay's own names: a template may not set them (they would be overwritten)
CONTEXT_ENV_NAMES: Final = frozenset(
    {ENV_HANDLER, ENV_MESSAGE_ID, ENV_ATTEMPT, ENV_DEADLINE, ENV_OCCURRENCE_ID,
     ENV_INGEST_URL, ENV_INGEST_TOKEN}
)


class HandlerContext(msgspec.Struct, frozen=True, kw_only=True):
    """The invocation's identity as its handler sees it (see the module doc)."""

    message_id: str
    attempt: int = 1
    occurrence_id: str = ""
    traceparent: str = ""  # a valid W3C traceparent or ""


@functools.lru_cache(maxsize=4)
def _second_text(second: int) -> str:
    # cached: every request formats its deadline, nearly always in the same
    # second as the one before, and strftime costs more than the rest of its env
    return datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")


def deadline_text(epoch_s: float) -> str:
    """``epoch_s`` as RFC 3339 UTC with milliseconds, rounded down (never later
    than the instant): ``2026-03-29T01:00:00.250Z``."""
    second, ms = divmod(math.floor(epoch_s * 1000), 1000)
    return f"{_second_text(second)}.{ms:03d}Z"


def invocation_env(
    handler: str, context: HandlerContext | None, deadline_epoch_s: float
) -> dict[str, str]:
    """The variables Relay adds to one request's environment (over the template's)."""
    env = {ENV_HANDLER: handler, ENV_DEADLINE: deadline_text(deadline_epoch_s)}
    if context is None:  # a request made outside delivery, invoke and replay
        return env
    env[ENV_MESSAGE_ID] = context.message_id
    env[ENV_ATTEMPT] = str(context.attempt)
    if context.occurrence_id:
        env[ENV_OCCURRENCE_ID] = context.occurrence_id
    if context.traceparent:
        env[ENV_TRACEPARENT] = context.traceparent
    return env


def ingest_env(url: str | None, token: str | None) -> dict[str, str]:
    """The handler's ingest variables: none without a URL; no token when the
    endpoint needs none (a loopback one) or its secret is unreadable now."""
    if url is None:
        return {}
    env = {ENV_INGEST_URL: url}
    if token is not None:
        env[ENV_INGEST_TOKEN] = token
    return env
