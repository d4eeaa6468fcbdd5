"""The DispatchMessage use case: one delivered message through the ledger.

Per message, at most two ledger calls (each one atomic, fenced Lua step in Redis):

1. ``begin`` classifies the event once, claims every eligible matched invocation
   with a fresh random token and a deadline on the ledger's clock, and settles the
   message at once when nothing needs to run (unmatched, all done, all exhausted);
2. the claimed invocations run one at a time (the spec's sequential order), each
   in a global then a function concurrency slot;
3. ``finish`` records every result (fenced by the token), writes any DLQ entry,
   and acknowledges the message when every gate is terminal.

Claims are taken before the slot wait, so each claim's lease covers the
invocations queued before it (timeouts plus slot waits, cumulatively); a claim
that never ran (no slot within the bounded wait, shutdown) is *released* to the
marker it replaced, so no attempt is charged. A claim error fails closed: nothing
runs and the message stays pending.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import msgspec
import structlog

from relay.application.bus import Outcome
from relay.application.dispatch_events import (
    newly_exhausted_events,
    outcome_name,
    pending_reason,
    settlement_events,
)
from relay.application.environment import resolve_environment
from relay.application.ports import (
    CatalogSource,
    Clock,
    EventStream,
    InvocationLedger,
    Invoker,
    SecretStore,
    SlotPool,
    TokenSource,
)
from relay.domain.commands import DispatchMessage
from relay.domain.errors import DependencyUnavailable, RelayError
from relay.domain.events import (
    EventClassified,
    InvocationDeferred,
    InvocationExhausted,
    InvocationFailed,
    InvocationFenced,
    InvocationStarted,
    InvocationSucceeded,
    MessageKeptPending,
)
from relay.domain.execution import (
    InvocationRequest,
    InvocationResult,
    SlotUnavailable,
    clamp_timeout_ns,
    crashed,
    failure_message,
)
from relay.domain.invocation import (
    Complete,
    Exhaust,
    Release,
    Retry,
    Transition,
    after_failure,
    invocation_field,
)
from relay.domain.messages import DomainEvent
from relay.domain.outcome import (
    CLAIMED,
    AttemptReport,
    BeginRequest,
    ClaimRequest,
    ClaimStatus,
    FinishRequest,
    Malformed,
    MalformedRequest,
    MessageContext,
    Settlement,
    exhaustion_reason,
    inspect_payload,
    rfc3339,
    unique_in_order,
)
from relay.domain.template import EventRule, Template

_log = structlog.get_logger(__name__)

# Each claim's lease adds this to the rule timeout: the container's own kill
# grace and the round trips around the run.
LEASE_GRACE_MS = 5_000
_CLEANUP_S = 5.0


class MessageReport(msgspec.Struct, frozen=True, kw_only=True):
    """The result of one dispatch: acknowledged or left pending (and why)."""

    message_id: str
    acknowledged: bool
    outcome: str


class _Planned(msgspec.Struct, frozen=True):
    field: str
    function: str
    rule: EventRule
    template: Template
    ready: bool


class MessageDispatcher:
    """Handler of :class:`DispatchMessage` (register it on the bus)."""

    def __init__(
        self,
        *,
        stream: EventStream,
        ledger: InvocationLedger,
        registry: CatalogSource,
        runtime: Invoker,
        slots: SlotPool,
        secrets: SecretStore,
        clock: Clock,
        tokens: TokenSource,
        max_event_bytes: int,
        slot_wait_s: float = 10.0,
    ) -> None:
        self._stream = stream
        self._ledger = ledger
        self._registry = registry
        self._runtime = runtime
        self._slots = slots
        self._secrets = secrets
        self._clock = clock
        self._tokens = tokens
        self._max_event_bytes = max_event_bytes
        self._pad_ms = int(slot_wait_s * 1000) + LEASE_GRACE_MS

    async def __call__(self, command: DispatchMessage) -> Outcome[MessageReport]:
        message = command.message
        ctx = MessageContext(
            stream=self._stream.stream,
            group=self._stream.group,
            consumer=self._stream.consumer,
            message_id=message.id,
            timestamp=rfc3339(self._clock.now()),
        )
        decoded = inspect_payload(message.payload, self._max_event_bytes)
        if isinstance(decoded, Malformed):
            return await self._dead_letter_malformed(ctx, decoded)
        plan, functions = self._plan(decoded)
        return await self._run(ctx, message.payload or b"", plan, functions)

    def _plan(self, event: Mapping[str, object]) -> tuple[list[_Planned], tuple[str, ...]]:
        catalog = self._registry.current()
        plan: dict[str, _Planned] = {}
        for match in catalog.index.match(event, self._clock.now()):
            fn = catalog.functions.get(match.function)
            if fn is None:
                continue
            field = invocation_field(match.function, match.rule.handler)
            if field not in plan:
                ready = fn.image is not None
                plan[field] = _Planned(field, match.function, match.rule, fn.template, ready)
        planned = list(plan.values())
        return planned, unique_in_order(p.function for p in planned)

    async def _dead_letter_malformed(
        self, ctx: MessageContext, malformed: Malformed
    ) -> Outcome[MessageReport]:
        request = MalformedRequest(context=ctx, reason=malformed.reason, event=malformed.summary)
        _log.warning("event_malformed", message_id=ctx.message_id, reason=malformed.reason)
        try:
            settlement = await self._ledger.dead_letter_malformed(request)
        except DependencyUnavailable as exc:
            return self._kept(ctx, "ledger_unavailable", exc)
        events = settlement_events(ctx.message_id, settlement, outcome="malformed")
        return Outcome(self._report(ctx, settlement.acknowledged, "malformed"), events)

    def _kept(self, ctx: MessageContext, reason: str, exc: Exception) -> Outcome[MessageReport]:
        _log.warning("ledger_unavailable", message_id=ctx.message_id, error=str(exc))
        return self._kept_with(ctx, reason, [])

    @staticmethod
    def _report(ctx: MessageContext, acked: bool, outcome: str) -> MessageReport:
        return MessageReport(message_id=ctx.message_id, acknowledged=acked, outcome=outcome)

    def _claims(self, plan: list[_Planned]) -> tuple[ClaimRequest, ...]:
        claims: list[ClaimRequest] = []
        lease = 0
        for p in plan:
            if not p.ready:
                continue
            lease += clamp_timeout_ns(p.rule.timeout_ns) // 1_000_000 + self._pad_ms
            claims.append(
                ClaimRequest(field=p.field, max_attempts=1 + max(0, p.rule.retries), lease_ms=lease)
            )
        return tuple(claims)

    async def _run(
        self,
        ctx: MessageContext,
        payload: bytes,
        plan: list[_Planned],
        functions: tuple[str, ...],
    ) -> Outcome[MessageReport]:
        blocked = any(not p.ready for p in plan)
        gates = tuple(p.field for p in plan)
        token = self._tokens.token()
        begin = BeginRequest(
            context=ctx,
            classification="matched:" + ",".join(functions) if functions else "unmatched",
            token=token,
            claims=self._claims(plan),
            gates=gates,
            blocked=blocked,
        )
        try:
            started = await self._ledger.begin(begin)
        except DependencyUnavailable as exc:
            # Fail closed: nothing runs, nothing is counted, the message stays pending.
            return self._kept(ctx, "claim_failed", exc)
        events: list[DomainEvent] = []
        if started.newly_classified:
            events.append(
                EventClassified(message_id=ctx.message_id, matched=bool(plan), functions=functions)
            )
        events += newly_exhausted_events(ctx.message_id, started.statuses)
        claimed = [s for s in started.statuses if s.status == CLAIMED]
        if not claimed:
            settlement = started.settlement
            waiting = pending_reason(started.statuses, blocked)
            outcome = outcome_name(settlement, bool(plan), waiting)
            events += settlement_events(ctx.message_id, settlement, outcome=outcome)
            return Outcome(self._report(ctx, settlement.acknowledged, outcome), events)
        return await self._execute(
            ctx,
            payload,
            token=token,
            plan=plan,
            blocked=blocked,
            statuses=started.statuses,
            claimed=claimed,
            events=events,
        )

    async def _execute(
        self,
        ctx: MessageContext,
        payload: bytes,
        *,
        token: str,
        plan: list[_Planned],
        blocked: bool,
        statuses: tuple[ClaimStatus, ...],
        claimed: list[ClaimStatus],
        events: list[DomainEvent],
    ) -> Outcome[MessageReport]:
        by_field = {p.field: p for p in plan}
        runs: list[_Run] = []
        try:
            for status in claimed:
                runs.append(await self._attempt(ctx, payload, by_field[status.field], status))
        except BaseException:
            # Shutdown (or any error) before a claim ran releases it: no attempt
            # charged. What did run is still recorded, shielded and bounded.
            for status in claimed[len(runs) :]:
                runs.append(_released(ctx, by_field[status.field], status, "shutdown"))
            with anyio.CancelScope(shield=True, deadline=anyio.current_time() + _CLEANUP_S):
                await self._finish(ctx, _finish_request(ctx, token, runs, by_field, blocked))
            raise
        # The usual path needs no shield of its own: a ledger call, once made,
        # completes even if this task is cancelled meanwhile (the port's promise).
        settled = await self._finish(ctx, _finish_request(ctx, token, runs, by_field, blocked))
        if settled is None:
            for run in runs:
                _log_results(run.events)
                events += run.events
            return self._kept_with(ctx, "finish_failed", events)
        rejected = set(settled.rejected)
        for run in runs:
            if run.report.field in rejected:
                events.append(_fenced(ctx, by_field[run.report.field], run.report.attempt))
            else:
                # Logged only now: a result the ledger rejected never counted, and
                # an operator must not read a success (or a retry) that did not happen.
                _log_results(run.events)
                events += run.events
        # an acknowledged message (the usual case) needs no pending reason
        fallback = (
            ""
            if settled.acknowledged
            else pending_reason(statuses, blocked, [r.report for r in runs])
        )
        outcome = outcome_name(settled, True, fallback)
        events += settlement_events(ctx.message_id, settled, outcome=outcome)
        return Outcome(self._report(ctx, settled.acknowledged, outcome), events)

    async def _finish(self, ctx: MessageContext, request: FinishRequest) -> Settlement | None:
        try:
            return await self._ledger.finish(request)
        except DependencyUnavailable as exc:
            # The results are lost; each claim expires at its deadline and the
            # next delivery runs it again (at-least-once).
            _log.warning("ledger_unavailable", message_id=ctx.message_id, error=str(exc))
            return None

    def _kept_with(
        self, ctx: MessageContext, reason: str, events: list[DomainEvent]
    ) -> Outcome[MessageReport]:
        events.append(MessageKeptPending(message_id=ctx.message_id, reason=reason))
        return Outcome(self._report(ctx, False, reason), events)

    async def _attempt(
        self, ctx: MessageContext, payload: bytes, planned: _Planned, status: ClaimStatus
    ) -> _Run:
        fn, handler, attempt = planned.function, planned.rule.handler, status.attempt
        max_attempts = 1 + max(0, planned.rule.retries)
        try:
            async with self._slots.acquire(fn):
                started = InvocationStarted(
                    function=fn, handler=handler, message_id=ctx.message_id, attempt=attempt
                )
                result = await self._invoke(ctx, payload, planned)
        except SlotUnavailable:
            return _released(ctx, planned, status, "slot_unavailable")
        transition: Transition = Complete() if result.ok else after_failure(attempt, max_attempts)
        error = result.error
        if isinstance(transition, Exhaust):
            error = exhaustion_reason(attempt, result.error)
        report = AttemptReport(
            field=planned.field, attempt=attempt, transition=transition, error=error
        )
        return _Run(report, (started, _result_event(ctx, planned, attempt, result, transition)))

    async def _invoke(
        self, ctx: MessageContext, payload: bytes, planned: _Planned
    ) -> InvocationResult:
        fn, handler = planned.function, planned.rule.handler
        try:
            env = resolve_environment(planned.template.env, planned.template.secrets, self._secrets)
            return await self._runtime.invoke(
                InvocationRequest(
                    function=fn,
                    handler=handler,
                    event=payload,
                    env=env,
                    timeout_ns=clamp_timeout_ns(planned.rule.timeout_ns),
                    context=ctx.message_id,
                )
            )
        except RelayError as exc:
            # The attempt was charged at claim; a runtime that could not serve it
            # (engine refused, function removed, missing secret) is a failure.
            return InvocationResult(ok=False, error=failure_message(fn, handler, str(exc)))
        except Exception as exc:  # noqa: BLE001 - an adapter bug is a failed attempt, never a lost message
            _log.exception("invocation_crashed", function=fn, handler=handler)
            # The type only: an exception's repr can hold what it was given (a
            # secret's bytes), and this text goes to the ledger and the DLQ.
            return InvocationResult(ok=False, error=failure_message(fn, handler, crashed(exc)))


def _finish_request(
    ctx: MessageContext, token: str, runs: list[_Run], by_field: dict[str, _Planned], blocked: bool
) -> FinishRequest:
    return FinishRequest(
        context=ctx,
        token=token,
        reports=tuple(r.report for r in runs),
        gates=tuple(by_field),
        blocked=blocked,
    )


class _Run(msgspec.Struct, frozen=True):
    report: AttemptReport
    events: tuple[DomainEvent, ...]


def _fenced(ctx: MessageContext, planned: _Planned, attempt: int) -> InvocationFenced:
    """A result the ledger rejected: this claim expired and a newer attempt holds the
    invocation. The result itself is not logged; this line says it did not count."""
    _log.warning(
        "invocation_fenced",
        function=planned.function,
        handler=planned.rule.handler,
        message_id=ctx.message_id,
        attempt=attempt,
    )
    return InvocationFenced(
        function=planned.function,
        handler=planned.rule.handler,
        message_id=ctx.message_id,
        attempt=attempt,
    )


def _released(ctx: MessageContext, planned: _Planned, status: ClaimStatus, reason: str) -> _Run:
    report = AttemptReport(
        field=planned.field, attempt=status.attempt, transition=Release(status.previous)
    )
    deferred = InvocationDeferred(
        function=planned.function,
        handler=planned.rule.handler,
        message_id=ctx.message_id,
        reason=reason,
    )
    return _Run(report, (deferred,))


def _result_event(
    ctx: MessageContext,
    planned: _Planned,
    attempt: int,
    result: InvocationResult,
    transition: Transition,
) -> DomainEvent:
    common: dict[str, Any] = {
        "function": planned.function,
        "handler": planned.rule.handler,
        "message_id": ctx.message_id,
        "attempt": attempt,
        "duration_s": result.duration_s,
    }
    if isinstance(transition, Complete):
        return InvocationSucceeded(**common)
    if isinstance(transition, Retry):
        return InvocationFailed(
            **common,
            error=result.error,
            exit_code=result.exit_code,
            retry_in_s=transition.backoff_ms / 1000,
        )
    return InvocationExhausted(**common, error=result.error, exit_code=result.exit_code)


def _log_results(events: Sequence[DomainEvent]) -> None:
    """The log lines of an attempt's result, once the ledger has recorded it."""
    for event in events:
        if isinstance(event, InvocationDeferred):
            # Nothing ran and nothing is charged; without this line an operator
            # would see only a message that stays pending.
            _log.warning(
                "invocation_deferred",
                function=event.function,
                handler=event.handler,
                message_id=event.message_id,
                reason=event.reason,
            )
        elif isinstance(event, InvocationSucceeded):
            _log.info("invocation_succeeded", **_fields(event))
        elif isinstance(event, InvocationFailed):
            _log.warning(
                "invocation_failed",
                **_fields(event),
                error=event.error,
                exit_code=event.exit_code,
                retry_in_s=event.retry_in_s,
            )
        elif isinstance(event, InvocationExhausted):
            _log.error(
                "invocation_exhausted",
                **_fields(event),
                error=event.error,
                exit_code=event.exit_code,
            )


def _fields(event: InvocationSucceeded | InvocationFailed | InvocationExhausted) -> dict[str, Any]:
    return {
        "function": event.function,
        "handler": event.handler,
        "message_id": event.message_id,
        "attempt": event.attempt,
        "duration_s": event.duration_s,
    }
