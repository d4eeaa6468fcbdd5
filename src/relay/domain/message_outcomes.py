"""How a delivery left its message: the codes of ``MessageAcknowledged.outcome``
and ``MessageKeptPending.reason`` (the worker's log, the batch reports, tests).

One place for the words the dispatcher chooses from; the values are the texts
they always were, so a log line or a metric label reads as before.
"""

from __future__ import annotations

from enum import StrEnum


class Acknowledged(StrEnum):
    """Why a message was acknowledged."""

    COMPLETED = "completed"  # every matched invocation completed
    DEAD_LETTERED = "dead_lettered"  # an invocation (or the payload) was dead-lettered
    UNMATCHED = "unmatched"  # no rule matched the event


class PendingReason(StrEnum):
    """Why a message stays pending after a delivery (recovery delivers it again)."""

    DEFERRED = "deferred"  # a claim was released: no slot, a breaker held it
    FUNCTION_UNAVAILABLE = "function_unavailable"  # the catalog or a template cannot be read
    BUILDING = "building"  # a matched function has no image yet
    RETRYING = "retrying"  # an attempt failed and backs off
    IN_PROGRESS = "in_progress"  # another invocation of the message still runs
    DLQ_FAILED = "dlq_failed"  # a dead-letter write failed; the ACK waits for it
