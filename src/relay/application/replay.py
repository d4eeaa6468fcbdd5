"""The ReplayDeadLetter use case: ``relay dlq replay <id>`` on the live worker.

Re-runs exactly the handler a dead-letter entry records (``function``/``handler``),
with the entry's original event (for a schedule occurrence, the payload its run
received), through the same runtime path as a stream event
(concurrency slots, capped timeout, env and secrets, the warm pool). The entry is
deleted only after the handler succeeded; on any failure it stays. Like
``relay function invoke`` this is an operator action outside the delivery
lifecycle: no ledger, no retry, no new DLQ entry, no event counters.
"""

from __future__ import annotations

import time

import msgspec
import structlog

from relay.application.bus import Emit, Outcome
from relay.application.invoke import (
    FunctionNotFound,
    FunctionUnavailable,
    run_once,
    serving_function,
)
from relay.application.ports import (
    CatalogSource,
    DeadLetterSource,
    Invoker,
    SecretStore,
    SlotPool,
)
from relay.domain import schedule
from relay.domain.commands import ReplayDeadLetter
from relay.domain.errors import RelayError
from relay.domain.events import HandlerInvoked
from relay.domain.execution import (
    InvocationRequest,
    clamp_timeout_ns,
    failure_message,
)
from relay.domain.handler_context import HandlerContext
from relay.domain.outcome import PLACEHOLDER, DeadLetterEntry
from relay.domain.template import EventRule, ScheduleRule, Template

_log = structlog.get_logger(__name__)

REPLAY_CONTEXT = "replay"  # prefixes the handler's forwarded output lines


class NotReplayable(RelayError):
    """The entry records a malformed message or a handler that no longer exists."""


class ReplayFailed(RelayError):
    """The replayed handler failed; the entry is kept."""


class ReplaySummary(msgspec.Struct, frozen=True, kw_only=True):
    entry_id: str
    function: str
    handler: str
    duration_s: float


class DeadLetterReplayer:
    """Handler of :class:`ReplayDeadLetter` (register it on the bus)."""

    def __init__(
        self,
        *,
        dead_letters: DeadLetterSource,
        registry: CatalogSource,
        runtime: Invoker,
        slots: SlotPool,
        secrets: SecretStore,
        emit: Emit,
    ) -> None:
        self._emit = emit
        self._dead_letters = dead_letters
        self._registry = registry
        self._runtime = runtime
        self._slots = slots
        self._secrets = secrets

    async def __call__(self, command: ReplayDeadLetter) -> Outcome[ReplaySummary]:
        stored = await self._dead_letters.get(command.entry_id)
        entry = stored.entry
        if PLACEHOLDER in (entry.function, entry.handler):
            raise NotReplayable(
                f"entry {stored.id} records a malformed message: there is no handler to replay"
            )
        template, timeout_ns = self._target(entry)
        started = time.monotonic()
        result = await run_once(
            slots=self._slots,
            runtime=self._runtime,
            secrets=self._secrets,
            template=template,
            request=InvocationRequest(
                function=entry.function,
                handler=entry.handler,
                event=_handler_input(entry),
                env={},
                timeout_ns=timeout_ns,
                context=REPLAY_CONTEXT,
                handler_context=replay_context(entry),
            ),
        )
        duration = time.monotonic() - started
        if not result.ok:
            _log.warning(
                "dead_letter_replay_failed",
                entry_id=stored.id,
                function=entry.function,
                handler=entry.handler,
                error=result.error,
            )
            raise ReplayFailed(result.error or failure_message(entry.function, entry.handler, ""))
        await self._dead_letters.discard(stored.id)
        _log.info(
            "dead_letter_replayed",
            entry_id=stored.id,
            function=entry.function,
            handler=entry.handler,
            duration=duration,
        )
        event = HandlerInvoked(
            function=entry.function, handler=entry.handler, ok=True, duration_s=duration, error=""
        )
        summary = ReplaySummary(
            entry_id=stored.id, function=entry.function, handler=entry.handler, duration_s=duration
        )
        self._emit(event)
        return Outcome(summary)

    def _target(self, entry: DeadLetterEntry) -> tuple[Template, int]:
        """The function's template and the recorded handler's capped timeout."""
        try:
            template: Template = serving_function(self._registry, entry.function).template
        except FunctionNotFound:
            raise NotReplayable(f'function "{entry.function}" no longer exists') from None
        except FunctionUnavailable as exc:
            raise NotReplayable(str(exc)) from None
        rules: tuple[EventRule | ScheduleRule, ...] = (*template.events, *template.schedules)
        if _occurrence(entry) is not None:  # its schedule, even if an event rule shares the name
            rules = template.schedules
        for rule in rules:
            if rule.handler == entry.handler:
                return template, clamp_timeout_ns(rule.timeout_ns)
        raise NotReplayable(
            f'function "{entry.function}" has no handler "{entry.handler}" any more'
        )


def _occurrence(entry: DeadLetterEntry) -> schedule.Envelope | None:
    """The envelope of an entry a schedule occurrence left (for its own handler)."""
    try:
        event = msgspec.json.decode(entry.event)
    except msgspec.DecodeError:
        return None
    if not isinstance(event, dict) or not schedule.is_occurrence(event):
        return None
    parsed = schedule.parse_occurrence(event)
    if not isinstance(parsed, schedule.Envelope):
        return None
    return parsed if (parsed.function, parsed.handler) == (entry.function, entry.handler) else None


def replay_context(entry: DeadLetterEntry) -> HandlerContext:
    """A replay is the original message once more: its id (what an idempotent
    handler keyed), one attempt past those the entry records, and for an
    occurrence its id."""
    occurrence = _occurrence(entry)
    return HandlerContext(
        message_id=entry.original_id,
        attempt=max(0, entry.handler_attempts) + 1,
        occurrence_id="" if occurrence is None else occurrence.occurrence_id,
    )


def _handler_input(entry: DeadLetterEntry) -> bytes:
    """What the handler reads: the original event, or for an occurrence exactly the
    payload its scheduled run received."""
    occurrence = _occurrence(entry)
    return entry.event.encode() if occurrence is None else schedule.handler_payload(occurrence)
