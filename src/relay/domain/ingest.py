"""What ``POST /v1/events`` accepts: the body's items, turned into Publications.

The body is one item or a JSON array of items (``docs/producing.md``, HTTP ingest)::

    {"event": {...}, "priority": "high", "deliver_at": "2026-12-24T18:00:00Z",
     "idempotency_key": "order-1234"}

Only ``event`` is required and must be a JSON object; its compact encoding is
what is appended, and it must fit ``MAX_EVENT_BYTES``. ``deliver_at`` is RFC 3339
with a zone (``Z`` or ``+02:00``; a time without one is ambiguous and refused) or
an integer of epoch milliseconds. An unknown field is refused (a typo such as
``priorty`` would otherwise be dropped silently). One bad item refuses the whole
request, so a request is appended entirely or not at all.

Pure: no I/O. The HTTP adapter reads and decodes the body; this checks it.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Final

from relay.domain.errors import EventError
from relay.domain.priority import InvalidPriority, priority_class
from relay.domain.publication import Publication

PATH: Final = "/v1/events"
MAX_ITEMS: Final = 1000  # items per request: bounds the work of one append
MAX_IDEMPOTENCY_KEY: Final = 256  # characters
DEFAULT_MAX_BODY_BYTES: Final = 2 * 1024 * 1024
HARD_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
DEFAULT_MAX_REQUESTS: Final = 16  # requests handled at once; one more is 429
READ_DEADLINE_S: Final = 10.0  # from accept to the answer, per connection
WAITING_CONNECTIONS: Final = 128  # parked, unread, beyond those being read
ITEM_FIELDS: Final = frozenset({"event", "priority", "deliver_at", "idempotency_key"})
HANDLER_TOKEN_CONTEXT: Final = b"relay ingest handler token v1"

# One counter per answer; the label set is closed (bounded series)
STATUSES: Final = (202, 400, 401, 413, 429, 503)


class IngestRefused(EventError):
    """A request refused for its content: 400 with this one line."""

    status = 400


class EventTooLarge(IngestRefused):
    """An event over ``MAX_EVENT_BYTES``: 413, like a body over its cap."""

    status = 413


def publications(body: Any, max_event_bytes: int, traceparent: str = "") -> list[Publication]:
    """The decoded body's items as Publications, or :class:`IngestRefused`.
    ``traceparent``: the request's W3C trace context (already checked), kept
    beside every event of the request."""
    items = body if isinstance(body, list) else [body]
    if not items:
        raise IngestRefused("the array is empty; send at least one item")
    if len(items) > MAX_ITEMS:
        raise IngestRefused(f"{len(items)} items in one request; at most {MAX_ITEMS}")
    single = not isinstance(body, list)
    out = []
    for index, item in enumerate(items):
        where = "" if single else f"item {index}: "
        try:
            out.append(_publication(item, max_event_bytes, traceparent or None))
        except IngestRefused as exc:
            raise type(exc)(f"{where}{exc}") from None
    return out


def _publication(item: Any, max_event_bytes: int, traceparent: str | None) -> Publication:
    if not isinstance(item, dict):
        raise IngestRefused(f'expected an object with an "event" field, not {_kind(item)}')
    unknown = sorted(set(item) - ITEM_FIELDS)
    if unknown:
        accepted = ", ".join(sorted(ITEM_FIELDS))
        raise IngestRefused(f"unknown field {unknown[0][:40]!r}; accepted: {accepted}")
    if "event" not in item:
        raise IngestRefused('the "event" field is missing')
    return Publication(
        payload=event_payload(item["event"], max_event_bytes),
        priority=_priority(item.get("priority")),
        deliver_at_ms=deliver_at_ms(item.get("deliver_at")),
        idempotency_key=_idempotency_key(item.get("idempotency_key")),
        traceparent=traceparent,
    )


def event_payload(event: Any, max_event_bytes: int) -> bytes:
    """The event's bytes as appended: a JSON object, compact, within the limit."""
    if not isinstance(event, dict):
        raise IngestRefused(f"event must be a JSON object, not {_kind(event)}")
    try:
        payload = json.dumps(
            event, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except ValueError:  # 1e400 decodes to infinity, which no JSON parser takes back
        raise IngestRefused("event holds a number out of range (no JSON for it)") from None
    if len(payload) > max_event_bytes:
        raise EventTooLarge(
            f"event is {len(payload)} bytes, over MAX_EVENT_BYTES ({max_event_bytes})"
        )
    return payload


def _priority(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise IngestRefused(f"priority must be a string, not {_kind(value)}")
    try:
        priority_class(value)  # the broker's own rule, checked before anything is written
    except InvalidPriority as exc:
        raise IngestRefused(str(exc)) from None
    return value


def deliver_at_ms(value: Any) -> int | None:
    """``deliver_at`` as epoch milliseconds: RFC 3339 with a zone, or an integer."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise IngestRefused(
            f"deliver_at must be an RFC 3339 time or epoch milliseconds, not {_kind(value)}"
        )
    if isinstance(value, int):
        if value < 0:
            raise IngestRefused("deliver_at must not be negative")
        return value
    try:
        instant = datetime.fromisoformat(value.replace("z", "Z"))
    except ValueError:
        raise IngestRefused(
            f"deliver_at {value[:40]!r} is not an RFC 3339 time such as 2026-12-24T18:00:00Z"
        ) from None
    if instant.tzinfo is None:
        raise IngestRefused(
            f"deliver_at {value[:40]!r} has no zone; add Z or an offset such as +02:00"
        )
    return int(instant.timestamp() * 1000)


def _idempotency_key(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise IngestRefused(f"idempotency_key must be a non-empty string, not {_kind(value)}")
    if len(value) > MAX_IDEMPOTENCY_KEY:
        raise IngestRefused(
            f"idempotency_key is {len(value)} characters; at most {MAX_IDEMPOTENCY_KEY}"
        )
    if not value.isprintable():
        raise IngestRefused("idempotency_key holds a control character")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    return "an array" if isinstance(value, list) else "an object"
