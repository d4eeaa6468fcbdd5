"""The log lines of delivery: one subscriber of the dispatch's domain events.

Every line an operator reads about a message's invocations comes from here, so a
line and the metric fed by the same event can never disagree. Event names are
stable snake_case (docs/operations.md lists them); the dispatcher binds
``message_id`` (and ``function``, ``handler``, ``attempt`` while an attempt runs)
as log context, so lines from deeper layers carry them too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import structlog

from relay.application.bus import MessageBus
from relay.domain import events as ev
from relay.domain.messages import DomainEvent
from relay.domain.schedule import FORGED_REASON

_NAME = "relay.application.dispatch"
_log = structlog.get_logger(_NAME)


def _attempt_fields(
    e: ev.InvocationSucceeded | ev.InvocationFailed | ev.InvocationExhausted,
) -> dict[str, Any]:
    return {
        "function": e.function,
        "handler": e.handler,
        "message_id": e.message_id,
        "attempt": e.attempt,
        "duration_s": e.duration_s,
    }


def _started(e: ev.InvocationStarted) -> None:
    _log.debug(
        "invocation_started",
        function=e.function,
        handler=e.handler,
        message_id=e.message_id,
        attempt=e.attempt,
    )


def _succeeded(e: ev.InvocationSucceeded) -> None:
    _log.info("invocation_succeeded", **_attempt_fields(e))


def _failed(e: ev.InvocationFailed) -> None:
    _log.warning(
        "invocation_failed",
        **_attempt_fields(e),
        error=e.error,
        exit_code=e.exit_code,
        retry_in_s=e.retry_in_s,
    )


def _exhausted(e: ev.InvocationExhausted) -> None:
    _log.error("invocation_exhausted", **_attempt_fields(e), error=e.error, exit_code=e.exit_code)


def _deferred(e: ev.InvocationDeferred) -> None:
    # Nothing ran and nothing is charged; without this line an operator would
    # see only a message that stays pending.
    _log.warning(
        "invocation_deferred",
        function=e.function,
        handler=e.handler,
        message_id=e.message_id,
        reason=e.reason,
    )


def _fenced(e: ev.InvocationFenced) -> None:
    # The result itself is not logged: this line says it did not count.
    _log.warning(
        "invocation_fenced",
        function=e.function,
        handler=e.handler,
        message_id=e.message_id,
        attempt=e.attempt,
    )


def _crashed(e: ev.InvocationCrashed) -> None:
    _log.error(
        "invocation_crashed",
        function=e.function,
        handler=e.handler,
        message_id=e.message_id,
        exc_info=e.exc,
    )


def _renewed(e: ev.LeaseRenewed) -> None:
    _log.info(
        "lease_renewed",
        function=e.function,
        handler=e.handler,
        message_id=e.message_id,
        attempt=e.attempt,
        remaining_ms=e.remaining_ms,
        lease_ms=e.lease_ms,
    )


def _malformed(e: ev.EventMalformed) -> None:
    _log.warning("event_malformed", message_id=e.message_id, reason=e.reason)


def _ledger_unavailable(e: ev.LedgerUnavailable) -> None:
    _log.warning("ledger_unavailable", message_id=e.message_id, call=e.call, error=e.error)


def _dead_lettered(e: ev.MessageDeadLettered) -> None:
    _log.error(
        "message_dead_lettered",
        message_id=e.message_id,
        function=e.function,
        handler=e.handler,
        entry_id=e.entry_id,
    )


def _dlq_failed(e: ev.DeadLetterWriteFailed) -> None:
    _log.error("dead_letter_write_failed", message_id=e.message_id, error=e.error)


def _published(e: ev.OccurrencePublished) -> None:
    _log.info(
        "occurrence_published",
        function=e.function,
        handler=e.handler,
        occurrence_id=e.occurrence_id,
        entry_id=e.entry_id,
        caught_up=e.caught_up,
    )


def _publish_failed(e: ev.OccurrencePublishFailed) -> None:
    # one warning per outage; the rest at debug (schedule_publish_failures_total counts all)
    line = _log.warning if e.first else _log.debug
    line(
        "occurrence_publish_failed",
        function=e.function,
        handler=e.handler,
        occurrence_id=e.occurrence_id,
        attempts=e.attempts,
        error=e.error,
    )


def _publish_recovered(e: ev.OccurrencePublishRecovered) -> None:
    _log.info("occurrence_publish_recovered", failed=e.failed)


def _obsolete(e: ev.OccurrenceObsolete) -> None:
    _log.info(
        "occurrence_obsolete",
        function=e.function,
        handler=e.handler,
        message_id=e.message_id,
        occurrence_id=e.occurrence_id,
    )


def _skipped(e: ev.OccurrenceSkipped) -> None:
    # Without this line an operator would see a schedule that silently did not run.
    _log.warning(
        "occurrence_skipped",
        function=e.function,
        handler=e.handler,
        message_id=e.message_id,
        occurrence_id=e.occurrence_id,
        reason="an earlier occurrence is still running (overlap: skip)",
    )


def _forged(e: ev.OccurrenceForged) -> None:
    # A producer (or an operator) publishing envelopes by hand: say so, loudly.
    _log.warning(
        "occurrence_forged",
        function=e.function,
        handler=e.handler,
        message_id=e.message_id,
        occurrence_id=e.occurrence_id,
        reason=FORGED_REASON,
    )


def _lost(e: ev.DeliveryLost) -> None:
    # Routine when consumers race for a message: the other one handles it.
    _log.debug("delivery_lost", message_id=e.message_id)


LINES: dict[type[DomainEvent], Callable[[Any], None]] = {
    ev.DeliveryLost: _lost,
    ev.OccurrencePublished: _published,
    ev.OccurrencePublishFailed: _publish_failed,
    ev.OccurrencePublishRecovered: _publish_recovered,
    ev.OccurrenceObsolete: _obsolete,
    ev.OccurrenceSkipped: _skipped,
    ev.OccurrenceForged: _forged,
    ev.InvocationStarted: _started,
    ev.InvocationSucceeded: _succeeded,
    ev.InvocationFailed: _failed,
    ev.InvocationExhausted: _exhausted,
    ev.InvocationDeferred: _deferred,
    ev.InvocationFenced: _fenced,
    ev.InvocationCrashed: _crashed,
    ev.LeaseRenewed: _renewed,
    ev.EventMalformed: _malformed,
    ev.LedgerUnavailable: _ledger_unavailable,
    ev.MessageDeadLettered: _dead_lettered,
    ev.DeadLetterWriteFailed: _dlq_failed,
}


# The two lines every handled event would otherwise pay for (one notify, a
# keyword dict, a filtered call) even when the level hides them: they are not
# subscribed at all then. The level is the process's, set once at start.
_HOT_LEVELS: dict[type[DomainEvent], int] = {
    ev.InvocationStarted: logging.DEBUG,
    ev.InvocationSucceeded: logging.INFO,
}


def subscribe_delivery_log(bus: MessageBus) -> None:
    """Register the delivery log lines on ``bus`` (all synchronous); call it after
    the logging is configured (the hot lines a level hides are left out)."""
    for kind, line in LINES.items():
        level = _HOT_LEVELS.get(kind)
        # a fresh proxy: asking the module's own would cache its logger for good
        if level is None or structlog.get_logger(_NAME).is_enabled_for(level):
            bus.subscribe(kind, line)
