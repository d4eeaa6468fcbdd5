"""One event to append to the broker, with how it is to be delivered.

Every producer (``relay publish``, the DLQ republish, HTTP ingest) hands the
broker a :class:`Publication`; the broker's :class:`EventPublisher` port (in
``application/ports.py``) appends a batch of them and answers with their message
ids once they are durable. The optional fields are delivery options the brokers
honour the same way: ``priority`` (the embedded broker's class; Redis has none),
``deliver_at_ms`` (not before this wall-clock time) and ``idempotency_key``
(a second publication of the key within the window adds nothing and answers
with the first one's id). ``traceparent``, a W3C trace context already checked
(``relay.domain.traceparent``), is kept beside the event, never inside it.

The rules on those options live here, once, for every producer and both brokers
(docs/producing.md): a time in the past is now; a time more than
:data:`MAX_DELAY_MS` ahead is refused (a typo such as a year too far would
otherwise sit in the broker unseen); a key is 1 to :data:`MAX_KEY_LENGTH`
characters of a small safe alphabet, so it is one token in a Redis key and a log
line, never a place for a secret or a control character.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Final
from urllib.parse import quote

from relay.domain.durations import DAY, HOUR, MILLISECOND

MAX_DELAY_NS: Final = 365 * DAY
MAX_DELAY_MS: Final = MAX_DELAY_NS // MILLISECOND
DEFAULT_DEDUP_WINDOW_NS: Final = 24 * HOUR
MAX_KEY_LENGTH: Final = 128
KEY_ALPHABET: Final = "letters, digits and . _ - : / @ + ="
_KEY: Final = re.compile(r"[A-Za-z0-9._\-:/@+=]+")
KEY_PREFIX: Final = "relay:publish:"
# A delayed event's id on Redis, before it is in the stream (docs/producing.md).
DELAYED_ID_PREFIX: Final = "delayed-"


class InvalidPublication(ValueError):
    """A delivery option out of its bounds (the message is one line, for the user)."""


@dataclass(frozen=True, slots=True)
class Publication:
    payload: bytes  # the event, already checked: a JSON object within MAX_EVENT_BYTES
    priority: str | None = None
    deliver_at_ms: int | None = None
    idempotency_key: str | None = None
    traceparent: str | None = None


def check_key(key: str) -> str:
    """``key`` if it is a valid idempotency key, else :class:`InvalidPublication`."""
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidPublication(
            f"idempotency key is {len(key)} characters: expected 1 to {MAX_KEY_LENGTH}"
        )
    if _KEY.fullmatch(key) is None:
        raise InvalidPublication(
            f"idempotency key {key[:40]!r} has other characters than {KEY_ALPHABET}"
        )
    return key


def due_ms(deliver_at_ms: int | None, now_ms: int) -> int | None:
    """When a publication becomes deliverable: ``None`` for now (no time, or one
    not after ``now_ms``: a time in the past is now), else its time."""
    if deliver_at_ms is None or deliver_at_ms <= now_ms:
        return None
    return deliver_at_ms


def check_delay(deliver_at_ms: int | None, now_ms: int) -> None:
    """Refuse a time more than :data:`MAX_DELAY_MS` after ``now_ms``."""
    if deliver_at_ms is not None and deliver_at_ms - now_ms > MAX_DELAY_MS:
        days = MAX_DELAY_MS // 86_400_000
        raise InvalidPublication(
            f"the time is more than {days} days ahead: an event is delayed {days} days at most"
        )


def check_all(publications: Iterable[Publication], now_ms: int) -> None:
    """Every publication's options, before a broker writes any of them."""
    for publication in publications:
        if publication.idempotency_key is not None:
            check_key(publication.idempotency_key)
        check_delay(publication.deliver_at_ms, now_ms)


def parse_time(text: str) -> int:
    """An RFC 3339 time with its zone (``2026-12-24T18:00:00Z``), in epoch ms."""
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidPublication(
            f"{text[:40]!r} is not an RFC 3339 time such as 2026-12-24T18:00:00Z"
        ) from None
    if at.tzinfo is None:
        raise InvalidPublication(
            f"{text[:40]!r} has no zone: add Z or an offset such as +01:00"
        )
    return int(at.timestamp() * 1000)


def key_record(stream: str, key: str) -> str:
    """Where a key's first id is kept: ``relay:publish:<stream, percent-encoded>:<key>``
    (the Redis key, and the embedded broker's ``occurrences`` row id)."""
    return f"{KEY_PREFIX}{quote(stream, safe='')}:{key}"


def delayed_id(due: int, number: int) -> str:
    """The id a delayed publish answers with on Redis: ``delayed-<due ms>-<n>``
    (``lua/publish.lua`` makes it in the script; the in-memory publisher with this)."""
    return f"{DELAYED_ID_PREFIX}{due}-{number}"


def delayed_due(message_id: str) -> int | None:
    """The due time a delayed id names (``delayed-<due ms>-<n>``, the id a delayed
    publish answers with on Redis: ``lua/publish.lua`` makes it), or ``None`` for
    any other id."""
    if not message_id.startswith(DELAYED_ID_PREFIX):
        return None
    due, sep, number = message_id[len(DELAYED_ID_PREFIX):].partition("-")
    return int(due) if sep and due.isdigit() and number.isdigit() else None
