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


class Ended(StrEnum):
    """How a schedule occurrence was acknowledged without running (its outcome)."""

    OBSOLETE = "obsolete"  # its schedule was removed or changed
    SKIPPED = "skipped"  # overlap: skip, and the previous occurrence is still unfinished
    FORGED = "forged"  # a copy of the entry publish-if-new appended


class Unsettled(StrEnum):
    """Why a delivery left its message unsettled for a reason of its own (besides
    :class:`PendingReason`): the ledger's answer never came, or the payload was bad."""

    MALFORMED = "malformed"  # not a JSON object event, or too large: dead-lettered at once
    FINISH_FAILED = "finish_failed"  # the finish call failed: the results are not recorded


class Released(StrEnum):
    """Why a claim was released unrun (no attempt charged; the message is redelivered)."""

    BREAKER_OPEN = "breaker_open"
    SLOT_UNAVAILABLE = "slot_unavailable"
    LEASE_LOST = "lease_lost"  # another worker holds the claim now
    LEASE_UNRENEWABLE = "lease_unrenewable"  # the ledger could not extend the lease
    SHUTDOWN = "shutdown"
