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
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Publication:
    payload: bytes  # the event, already checked: a JSON object within MAX_EVENT_BYTES
    priority: str | None = None
    deliver_at_ms: int | None = None
    idempotency_key: str | None = None
    traceparent: str | None = None
