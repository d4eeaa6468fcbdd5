"""What the broker knows about one message, and the verdict the ledger's rules give it.

``relay trace`` reads a :class:`MessageFacts` through the ``MessageFactsReader``
port (either broker) and renders it; every question about the ledger's hash
(which fields are invocations, what the classification says, whether every gate
is terminal) is answered here, with the ledger's own vocabulary
(:mod:`relay.domain.ledger_rules`, :mod:`relay.domain.classification`) and the
rule the settle step applies (:func:`relay.domain.outcome.message_outcome`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from relay.domain import classification as codec
from relay.domain.classification import Classification, ClassKind
from relay.domain.invocation import (
    BackingOff,
    Exhausted,
    Marker,
    Running,
    claimed_at_field,
    parse_marker,
)
from relay.domain.ledger_rules import (
    CLASS_FIELD,
    MALFORMED_FIELD,
    error_field,
    is_invocation,
    parse_claim_stamp,
    parse_class_stamp,
)
from relay.domain.outcome import Acknowledge, message_outcome

NO_KEY_TTL = -2  # Redis's TTL answers, which the embedded broker imitates
NO_EXPIRY_TTL = -1
DLQ_SCAN_LIMIT = 10_000  # DLQ entries a Redis trace examines (from the message's time on)


@dataclass(frozen=True)
class DeadLetterFact:
    """The fields of one DLQ entry a trace shows."""

    id: str
    fields: Mapping[str, str]

    def get(self, name: str) -> str:
        return self.fields.get(name, "")


@dataclass
class MessageFacts:
    """Everything the broker knows about one message, read at ``now_ms`` (its clock)."""

    message_id: str
    stream: str
    group: str
    now_ms: int
    ledger: dict[str, str] = field(default_factory=dict)
    ledger_ttl_s: int = NO_KEY_TTL  # -2 no ledger, -1 no expiry
    body_bytes: int | None = None  # None: the entry is gone (trimmed or deleted)
    pending: dict[str, Any] | None = None  # consumer, idle ms, deliveries
    dead_letters: list[DeadLetterFact] = field(default_factory=list)
    dlq_scan_complete: bool = True
    delayed_until_ms: int | None = None  # a delayed event not due yet (docs/producing.md)

    def invocations(self) -> list[str]:
        """The invocation fields (``function/handler``), sorted."""
        return sorted(k for k in self.ledger if is_invocation(k))

    def markers(self) -> list[Marker | None]:
        return [parse_marker(v) for k, v in self.ledger.items() if is_invocation(k)]

    def classification(self) -> Classification | None:
        """The recorded classification, or ``None`` before the message is classified."""
        text = parse_class_stamp(self.ledger.get(CLASS_FIELD))[0]
        return None if text is None else codec.decode(text)

    def malformed_entry(self) -> str | None:
        """The DLQ entry id a malformed message was dead-lettered as."""
        return self.ledger.get(MALFORMED_FIELD)

    def last_error(self, invocation: str) -> str | None:
        return self.ledger.get(error_field(invocation))

    def claimed_at_ms(self, invocation: str) -> int | None:
        """When the invocation's current claim was taken (the ledger's clock)."""
        return parse_claim_stamp(self.ledger.get(claimed_at_field(invocation)))[0]

    def is_occurrence(self) -> bool:
        found = self.classification()
        return found is not None and found.kind is ClassKind.OCCURRENCE


class Verdict(StrEnum):
    """The short answer to "why has this event not finished?" (stable codes)."""

    DELAYED = "delayed"
    MALFORMED = "malformed"
    ACKNOWLEDGED_WITHOUT_RUN = "acknowledged_without_run"
    FINISHED = "finished"
    UNKNOWN = "unknown"
    NOT_DELIVERED = "not_delivered"
    BODY_GONE = "body_gone"
    NOT_CLASSIFIED = "not_classified"
    BACKING_OFF = "backing_off"
    RUNNING = "running"
    DLQ_WRITE_PENDING = "dlq_write_pending"
    ACK_MISSING = "ack_missing"
    PENDING = "pending"


def verdict(facts: MessageFacts) -> Verdict:  # noqa: PLR0911 - one answer per situation
    """The message's situation, most telling first."""
    markers = facts.markers()
    if facts.delayed_until_ms is not None:
        return Verdict.DELAYED
    if facts.malformed_entry() is not None:
        return Verdict.MALFORMED
    if facts.pending is None:
        if facts.ledger and not markers and facts.is_occurrence():
            return Verdict.ACKNOWLEDGED_WITHOUT_RUN
        if facts.ledger:
            return Verdict.FINISHED
        return Verdict.UNKNOWN if facts.body_bytes is None else Verdict.NOT_DELIVERED
    if facts.body_bytes is None:
        return Verdict.BODY_GONE
    if not facts.ledger:
        return Verdict.NOT_CLASSIFIED
    if any(isinstance(m, BackingOff) for m in markers):
        return Verdict.BACKING_OFF
    if any(isinstance(m, Running) and m.deadline_ms > facts.now_ms for m in markers):
        return Verdict.RUNNING
    if any(isinstance(m, Exhausted) and not m.dead_lettered for m in markers):
        return Verdict.DLQ_WRITE_PENDING
    if every_gate_terminal(facts):
        return Verdict.ACK_MISSING
    return Verdict.PENDING


def every_gate_terminal(facts: MessageFacts) -> bool:
    """Whether the settle step would acknowledge the message now: every matched
    function has an invocation (one that never ran, still building, gates it) and
    :func:`message_outcome` says ``Acknowledge`` over them. A schedule occurrence
    is gated by exactly its schedule's invocation."""
    gates = {k: parse_marker(v) for k, v in facts.ledger.items() if is_invocation(k)}
    found = facts.classification()
    if not gates or found is None:
        return False
    if found.kind is ClassKind.MATCHED:
        recorded = {name.split("/", 1)[0] for name in gates}
        if not set(found.functions) <= recorded:
            return False
    elif found.kind is not ClassKind.OCCURRENCE:
        return False
    return isinstance(message_outcome(gates, blocked=False), Acknowledge)
