"""The ``traceparent`` field of a stream entry, as both brokers read it."""

from __future__ import annotations

import structlog

from relay.domain.traceparent import valid_traceparent

_log = structlog.get_logger("relay.trace")


def entry_traceparent(raw: str | bytes | None, message_id: str) -> str:
    """The entry's traceparent when valid; a bad one is ignored (never a reason to
    fail the message), with a debug line: the producer's bug, not an operator's."""
    if not raw:
        return ""
    valid = valid_traceparent(raw)
    if not valid:
        _log.debug("traceparent_ignored", message_id=message_id, reason="not a W3C traceparent")
    return valid
