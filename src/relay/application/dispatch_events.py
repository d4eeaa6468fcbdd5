"""The domain events of one dispatch: how the ledger left the message and why.

Split from :mod:`relay.application.dispatch` so the use case reads as its steps.
Names and fields of the events are documented in :mod:`relay.domain.events`.
"""

from __future__ import annotations

from typing import Any

from relay.domain.events import (
    DeadLetterWriteFailed,
    InvocationExhausted,
    InvocationFailed,
    InvocationFenced,
    InvocationSucceeded,
    MessageAcknowledged,
    MessageDeadLettered,
    MessageKeptPending,
    OccurrenceForged,
    OccurrenceObsolete,
    OccurrenceSkipped,
)
from relay.domain.execution import InvocationResult
from relay.domain.invocation import Complete, Release, Retry, Transition, expired_detail
from relay.domain.message_outcomes import Acknowledged, Ended, PendingReason
from relay.domain.messages import DomainEvent
from relay.domain.outcome import (
    BACKOFF,
    EXHAUSTED,
    PLACEHOLDER,
    AttemptReport,
    ClaimStatus,
    Settlement,
    split_field,
)
from relay.domain.schedule import Envelope


def newly_exhausted_events(message_id: str, statuses: tuple[ClaimStatus, ...]) -> list[DomainEvent]:
    events: list[DomainEvent] = []
    for s in statuses:
        if s.status == EXHAUSTED and s.newly:
            fn, handler = split_field(s.field)
            error = expired_detail(s.attempt)
            events.append(
                InvocationExhausted(
                    function=fn,
                    handler=handler,
                    message_id=message_id,
                    attempt=s.attempt,
                    duration_s=0.0,
                    error=error,
                )
            )
    return events


def pending_reason(
    statuses: tuple[ClaimStatus, ...],
    blocked: bool,
    reports: list[AttemptReport] | None = None,
    *,
    waiting: bool = False,
) -> PendingReason:
    if any(isinstance(r.transition, Release) for r in reports or ()):
        return PendingReason.DEFERRED
    if waiting:
        return PendingReason.FUNCTION_UNAVAILABLE
    if blocked:
        return PendingReason.BUILDING
    if any(isinstance(r.transition, Retry) for r in reports or ()):
        return PendingReason.RETRYING
    if any(s.status == BACKOFF for s in statuses):
        return PendingReason.RETRYING
    return PendingReason.IN_PROGRESS


def outcome_name(settlement: Settlement, matched: bool, pending_reason: str) -> str:
    if not settlement.acknowledged:
        return PendingReason.DLQ_FAILED if settlement.dlq_error else pending_reason
    if settlement.dead_lettered or not matched:
        return Acknowledged.DEAD_LETTERED if settlement.dead_lettered else Acknowledged.UNMATCHED
    return Acknowledged.COMPLETED


def settlement_events(
    message_id: str, settlement: Settlement | None, *, outcome: str
) -> list[DomainEvent]:
    """The events of how a ledger call left the message."""
    events: list[DomainEvent] = []
    if settlement is None:
        events.append(MessageKeptPending(message_id=message_id, reason=outcome))
        return events
    for entry in settlement.dead_lettered:
        fn, handler = (
            (PLACEHOLDER, PLACEHOLDER) if entry.field == PLACEHOLDER else split_field(entry.field)
        )
        events.append(
            MessageDeadLettered(
                function=fn,
                handler=handler,
                message_id=message_id,
                entry_id=entry.entry_id,
                handler_attempts=entry.attempt,
                reason=entry.reason,
            )
        )
    if settlement.dlq_error:
        events.append(DeadLetterWriteFailed(message_id=message_id, error=settlement.dlq_error))
    if settlement.acknowledged:
        events.append(MessageAcknowledged(message_id=message_id, outcome=outcome))
    else:
        events.append(MessageKeptPending(message_id=message_id, reason=outcome))
    return events


def ended_event(message_id: str, occurrence: Envelope | None, ended: str) -> DomainEvent:
    """An occurrence acknowledged without a run: obsolete, skipped (overlap), or a
    copy (forged)."""
    assert occurrence is not None
    kinds: dict[str, type[OccurrenceSkipped] | type[OccurrenceForged]] = {
        Ended.SKIPPED: OccurrenceSkipped, Ended.FORGED: OccurrenceForged,
    }
    kind = kinds.get(ended, OccurrenceObsolete)
    return kind(
        function=occurrence.function,
        handler=occurrence.handler,
        message_id=message_id,
        occurrence_id=occurrence.occurrence_id,
    )


def fenced_event(message_id: str, function: str, handler: str, attempt: int) -> InvocationFenced:
    """A result the ledger rejected: this claim expired and a newer attempt holds
    the invocation. The result itself is not published; this says it did not count."""
    return InvocationFenced(
        function=function, handler=handler, message_id=message_id, attempt=attempt
    )


def result_event(
    *,
    function: str,
    handler: str,
    message_id: str,
    attempt: int,
    result: InvocationResult,
    transition: Transition,
) -> DomainEvent:
    """What one attempt's result means: succeeded, failed (a retry comes) or exhausted."""
    common: dict[str, Any] = {
        "function": function,
        "handler": handler,
        "message_id": message_id,
        "attempt": attempt,
        "duration_s": result.duration_s,
    }
    if isinstance(transition, Complete):
        return InvocationSucceeded(**common)
    failure: dict[str, Any] = {"error": result.error, "exit_code": result.exit_code}
    if isinstance(transition, Retry):
        return InvocationFailed(**common, **failure, retry_in_s=transition.backoff_ms / 1000)
    return InvocationExhausted(**common, **failure)
