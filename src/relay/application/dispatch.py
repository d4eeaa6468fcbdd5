"""The DispatchMessage use case: one delivered message through the ledger.

A message takes four steps, each a method below, each publishing its own domain
events as it happens (log lines come from one subscriber of those events,
:mod:`relay.application.delivery_log`):

1. **plan**: decode and match the event (anything that cannot be decoded or
   classified, for whatever reason, is dead-lettered at once);
2. **claim**: one ``begin`` call classifies the event once, claims every
   eligible matched invocation with a fresh random token and a deadline on the
   ledger's clock, and settles the message at once when nothing needs to run.
   Invocations the ledger already records but the current rules no longer match
   come back as *unplanned*: each is run again if its rule still exists, waited
   for if its function is unavailable, or released if its function or rule was
   deliberately removed; a second ``begin`` (same token, so safe to repeat)
   claims them;
3. **attempt**: the claimed invocations run one at a time (the spec's order),
   each in a global then a function concurrency slot; right before a handler
   starts, its claim's remaining lease is checked against its timeout and
   renewed when it would not cover it (a slow cold start);
4. **settle**: one ``finish`` call records every result (fenced by the token),
   writes any DLQ entry, and acknowledges the message when every invocation that
   gates it is terminal.

A claim that never ran (no slot within the bounded wait, a lease that could not
be renewed, shutdown) is *released* to the marker it replaced, so no attempt is
charged. A claim error fails closed: nothing runs and the message stays pending.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from relay.application.breakers import BreakerBoard, counted_result
from relay.application.bus import Outcome
from relay.application.classify import Occurrence, classify
from relay.application.dispatch_events import (
    ended_event,
    fenced_event,
    newly_exhausted_events,
    outcome_name,
    pending_reason,
    result_event,
    settlement_events,
)
from relay.application.dispatch_lease import Lease, Leases
from relay.application.environment import resolve_environment
from relay.application.log_context import log_context
from relay.application.occurrence_plan import OccurrenceGone, OccurrenceRun, OccurrenceWait
from relay.application.ports import (
    CatalogSource,
    Clock,
    EventStream,
    InvocationLedger,
    Invoker,
    OccurrenceHistory,
    SecretStore,
    SlotPool,
    TokenSource,
)
from relay.application.registry import Catalog
from relay.domain import schedule
from relay.domain.commands import DispatchMessage
from relay.domain.errors import DependencyUnavailable, RelayError
from relay.domain.events import (
    EventClassified,
    EventMalformed,
    InvocationCrashed,
    InvocationDeferred,
    LedgerUnavailable,
    MessageKeptPending,
)
from relay.domain.execution import (
    InvocationRequest,
    InvocationResult,
    LeaseLost,
    SlotUnavailable,
    clamp_timeout_ns,
    crashed,
    failure_message,
)
from relay.domain.handler_context import HandlerContext
from relay.domain.invocation import (
    Complete,
    Exhaust,
    Release,
    Transition,
    after_failure,
    exhaustion_reason,
    invocation_field,
)
from relay.domain.messages import DomainEvent
from relay.domain.outcome import (
    CLAIMED,
    AttemptReport,
    BeginRequest,
    BeginResult,
    ClaimRequest,
    ClaimStatus,
    FinishRequest,
    Malformed,
    MalformedRequest,
    MessageContext,
    Settlement,
    rfc3339,
    split_field,
    unique_in_order,
)
from relay.domain.schedule import Envelope
from relay.domain.template import HandlerRule, Template

Notify = Callable[[DomainEvent], None]

# Each claim's lease adds this to the rule timeout: the container's own kill
# grace and the round trips around the run.
LEASE_GRACE_MS = 5_000
_CLEANUP_S = 5.0


def _discard(_event: DomainEvent) -> None:
    return None


class MessageReport(msgspec.Struct, frozen=True, kw_only=True):
    """The result of one dispatch: acknowledged or left pending (and why)."""

    message_id: str
    acknowledged: bool
    outcome: str


class _Planned(msgspec.Struct, frozen=True):
    field: str
    function: str
    rule: HandlerRule  # an event rule, or the schedule of an occurrence
    template: Template
    ready: bool
    occurrence_id: str = ""  # a schedule occurrence's (RELAY_OCCURRENCE_ID)


class _Plan(msgspec.Struct, frozen=True, kw_only=True):
    """What the current catalog says about one message."""

    invocations: tuple[_Planned, ...]
    functions: tuple[str, ...]  # matched now, for the classification
    released: tuple[str, ...] = ()
    waiting: bool = False  # a recorded invocation's function is unavailable
    # A schedule occurrence (matching bypassed): what its handler reads, whether
    # it must not overlap an earlier one, and how it ended when nothing runs
    # (``obsolete``, ``skipped``).
    occurrence: Envelope | None = None
    handler_input: bytes | None = None
    skip_overlap: bool = False
    ended: str = ""

    @property
    def blocked(self) -> bool:
        return self.waiting or any(not p.ready for p in self.invocations)

    @property
    def gates(self) -> tuple[str, ...]:
        return tuple(p.field for p in self.invocations)


class _Run(msgspec.Struct, frozen=True):
    planned: _Planned  # the invocation this attempt (or release) was of
    report: AttemptReport
    events: tuple[DomainEvent, ...]  # published once the ledger recorded the report


class MessageDispatcher:
    """Handler of :class:`DispatchMessage` (register it on the bus).

    ``notify`` receives every domain event as it happens (the bus's ``notify``);
    the :class:`Outcome` carries none, so nothing is published twice.
    """

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
        notify: Notify = _discard,
        lease_grace_ms: int = LEASE_GRACE_MS,
        history: OccurrenceHistory | None = None,
        breakers: BreakerBoard | None = None,
    ) -> None:
        """``history`` answers ``overlap: skip``; without one, occurrences overlap.
        ``breakers`` holds invocations of functions whose breaker is open."""
        self._stream = stream
        self._ledger = ledger
        self._registry = registry
        self._runtime = runtime
        self._slots = slots
        self._secrets = secrets
        self._clock = clock
        self._tokens = tokens
        self._max_event_bytes = max_event_bytes
        self._grace_ms = lease_grace_ms
        self._pad_ms = int(slot_wait_s * 1000) + lease_grace_ms
        self._notify = notify
        self._history = history
        self._breakers = breakers

    async def __call__(self, command: DispatchMessage) -> Outcome[MessageReport]:
        message = command.message
        ctx = MessageContext(
            stream=self._stream.stream,
            group=self._stream.group,
            consumer=self._stream.consumer,
            message_id=message.id,
            timestamp=rfc3339(self._clock.now()),
        )
        with log_context(message_id=message.id):
            planned = self._plan(message.payload)
            if isinstance(planned, Malformed):
                return Outcome(await self._dead_letter_malformed(ctx, planned))
            if planned.skip_overlap and message.reclaimed:
                # Skipping is decided on the first delivery only: a redelivered
                # occurrence may hold a claim or a retry of its own, which a skip
                # would acknowledge away.
                planned = msgspec.structs.replace(planned, skip_overlap=False)
            return Outcome(await self._deliver(ctx, message.payload or b"", planned))

    def _publish(self, events: list[DomainEvent] | tuple[DomainEvent, ...]) -> None:
        for event in events:
            self._notify(event)

    # --- 1. plan ------------------------------------------------------------------

    def _plan(self, payload: bytes | None) -> _Plan | Malformed:
        """Decode and match; an event that cannot be decoded or classified for any
        reason (not JSON, too deep for the decoder or the matcher, ...) is malformed."""
        catalog = self._registry.current()
        matches = classify(payload, self._max_event_bytes, catalog, self._clock.now())
        if isinstance(matches, Malformed):
            return matches
        if not isinstance(matches, list):
            return _plan_occurrence(matches)
        plan: dict[str, _Planned] = {}
        for match in matches:
            fn = catalog.functions.get(match.function)
            field = invocation_field(match.function, match.rule.handler)
            if fn is not None and field not in plan:
                plan[field] = _Planned(field, match.function, match.rule, fn.template, fn.ready)
        planned = tuple(plan.values())
        return _Plan(
            invocations=planned,
            functions=unique_in_order(p.function for p in planned),
            # A template that cannot be read might match this event: nothing is
            # acknowledged until it is fixed or its directory removed (everything
            # else still runs). Before the first scan, nothing is known yet.
            waiting=bool(catalog.unavailable) or not catalog.complete,
        )

    def _replan(self, plan: _Plan, unplanned: tuple[str, ...]) -> _Plan:
        """Decide what each recorded, unplanned invocation is: run again (its rule
        still exists), waited for (its function is unavailable, or the catalog is
        not loaded yet), or released (deliberately removed from a valid catalog)."""
        catalog: Catalog = self._registry.current()
        extra: list[_Planned] = []
        released: list[str] = []
        waiting = False
        for field in unplanned:
            function, handler = split_field(field)
            # an occurrence runs its schedule only: nothing else it recorded is rerun
            rule = None if plan.occurrence else catalog.rule(function, handler)
            fn = catalog.functions.get(function)
            if rule is not None and fn is not None:
                extra.append(_Planned(field, function, rule, fn.template, fn.ready))
            elif function in catalog.unavailable or not catalog.complete:
                waiting = True
            elif fn is not None and not fn.ready:
                waiting = True  # still building: its rules are not known to be gone
            else:
                released.append(field)
        return msgspec.structs.replace(
            plan,
            invocations=plan.invocations + tuple(extra),
            released=tuple(released),
            waiting=waiting or plan.waiting,
        )

    # --- 2. claim -----------------------------------------------------------------

    def _begin_request(self, ctx: MessageContext, plan: _Plan, token: str) -> BeginRequest:
        claims: list[ClaimRequest] = []
        lease = 0
        for p in plan.invocations:
            if p.ready:
                lease += clamp_timeout_ns(p.rule.timeout_ns) // 1_000_000 + self._pad_ms
                max_attempts = 1 + max(0, p.rule.retries)
                claims.append(
                    ClaimRequest(field=p.field, max_attempts=max_attempts, lease_ms=lease)
                )
        functions = plan.functions
        if plan.occurrence is not None:
            classification = plan.occurrence.occurrence_id  # never an event's class
        else:
            classification = "matched:" + ",".join(functions) if functions else "unmatched"
        return BeginRequest(
            context=ctx,
            classification=classification,
            token=token,
            claims=tuple(claims),
            gates=plan.gates,
            released=plan.released,
            blocked=plan.blocked,
        )

    async def _claim(
        self, ctx: MessageContext, plan: _Plan, token: str
    ) -> tuple[_Plan, BeginRequest, BeginResult] | None:
        """Classify and claim; ``None`` when the ledger could not be reached."""
        request = self._begin_request(ctx, plan, token)
        try:
            started = await self._ledger.begin(request)
        except DependencyUnavailable as exc:
            self._notify(LedgerUnavailable(message_id=ctx.message_id, call="begin", error=str(exc)))
            return None
        if started.newly_classified and plan.occurrence is None:
            self._notify(
                EventClassified(
                    message_id=ctx.message_id,
                    matched=bool(plan.invocations),
                    functions=plan.functions,
                )
            )
        if started.unplanned:
            # Rare: a second begin with the same token (safe to repeat) claims or
            # releases what the ledger records beyond the current match.
            replanned = self._replan(plan, started.unplanned)
            again = self._begin_request(ctx, replanned, token)
            try:
                started = await self._ledger.begin(again)
            except DependencyUnavailable as exc:
                # The first claims stand; the unplanned ones keep the message pending.
                self._notify(
                    LedgerUnavailable(message_id=ctx.message_id, call="begin", error=str(exc))
                )
            else:
                plan, request = replanned, again
        self._publish(newly_exhausted_events(ctx.message_id, started.statuses))
        return plan, request, started

    async def _deliver(self, ctx: MessageContext, payload: bytes, plan: _Plan) -> MessageReport:
        if plan.skip_overlap:
            plan = await self._overlap(ctx, plan)
        if plan.handler_input is not None:
            payload = plan.handler_input
        token = self._tokens.token()
        begun = self._clock.monotonic()
        claimed = await self._claim(ctx, plan, token)
        if claimed is None:
            # Fail closed: nothing runs, nothing is counted, the message stays pending.
            return self._kept(ctx, "claim_failed")
        plan, request, started = claimed
        to_run = [s for s in started.statuses if s.status == CLAIMED]
        if not to_run:
            settlement = started.settlement
            waiting = pending_reason(started.statuses, plan.blocked, waiting=plan.waiting)
            outcome = outcome_name(settlement, bool(plan.invocations), waiting)
            if plan.ended and settlement.acknowledged and not settlement.dead_lettered:
                outcome = plan.ended
                self._notify(ended_event(ctx.message_id, plan.occurrence, plan.ended))
            self._publish(settlement_events(ctx.message_id, settlement, outcome=outcome))
            return self._report(ctx, settlement.acknowledged, outcome)
        leases = {c.field: c.lease_ms for c in request.claims}
        runs = await self._attempt_all(
            ctx, payload, token=token, leases=Leases(begun, leases), claimed=to_run, plan=plan
        )
        return await self._settle(ctx, token, plan, started.statuses, runs)

    async def _overlap(self, ctx: MessageContext, plan: _Plan) -> _Plan:
        """``overlap: skip``: nothing runs while an earlier occurrence of the same
        schedule is not terminal. A broker that cannot tell fails open (it runs:
        at-least-once first)."""
        occurrence = plan.occurrence
        if occurrence is None or self._history is None:
            return plan
        prefix = schedule.schedule_prefix(occurrence.function, occurrence.handler)
        try:
            busy = await self._history.unfinished_before(prefix, ctx.message_id)
        except DependencyUnavailable as exc:
            self._notify(
                LedgerUnavailable(message_id=ctx.message_id, call="overlap", error=str(exc))
            )
            return plan
        if not busy:
            return plan
        return _Plan(invocations=(), functions=(), occurrence=occurrence, ended="skipped")

    # --- 3. attempt ---------------------------------------------------------------

    async def _attempt_all(
        self,
        ctx: MessageContext,
        payload: bytes,
        *,
        token: str,
        leases: Leases,
        claimed: list[ClaimStatus],
        plan: _Plan,
    ) -> list[_Run]:
        by_field = {p.field: p for p in plan.invocations}
        runs: list[_Run] = []
        try:
            for status in claimed:
                lease = Lease(
                    renew=self._ledger.renew,
                    clock=self._clock,
                    notify=self._notify,
                    grace_ms=self._grace_ms,
                    ctx=ctx,
                    token=token,
                    status=status,
                    leases=leases,
                )
                runs.append(
                    await self._attempt(ctx, payload, by_field[status.field], status, lease)
                )
        except BaseException:
            # Shutdown (or any error) before a claim ran to its end releases it: no
            # attempt charged. What did run is still recorded, shielded and bounded.
            for status in claimed[len(runs) :]:
                runs.append(_released(ctx, by_field[status.field], status, "shutdown"))
            with anyio.CancelScope(shield=True, deadline=anyio.current_time() + _CLEANUP_S):
                await self._finish(ctx, self._finish_request(ctx, token, runs, plan))
            self._record_breakers(ctx, plan, runs, None)
            raise
        return runs

    async def _attempt(
        self,
        ctx: MessageContext,
        payload: bytes,
        planned: _Planned,
        status: ClaimStatus,
        lease: Lease,
    ) -> _Run:
        fn, handler, attempt = planned.function, planned.rule.handler, status.attempt
        timeout_ns = clamp_timeout_ns(planned.rule.timeout_ns)
        with log_context(function=fn, handler=handler, attempt=attempt):
            try:
                async with self._slots.acquire(fn):
                    # Asked only once a slot is held: invocations queued for the slot
                    # when the breaker opens must not all run against a dead downstream.
                    if not self._admitted(ctx, planned):
                        return _released(ctx, planned, status, "breaker_open")
                    result = await self._invoke(
                        ctx, payload, planned, lease.guard(timeout_ns), attempt
                    )
            except SlotUnavailable:
                return _released(ctx, planned, status, "slot_unavailable")
            except LeaseLost as exc:
                return _released(ctx, planned, status, exc.reason)
        max_attempts = 1 + max(0, planned.rule.retries)
        transition: Transition = Complete() if result.ok else after_failure(attempt, max_attempts)
        error = result.error
        if isinstance(transition, Exhaust):
            error = exhaustion_reason(attempt, result.error)
        report = AttemptReport(
            field=planned.field, attempt=attempt, transition=transition, error=error
        )
        event = result_event(
            function=fn,
            handler=handler,
            message_id=ctx.message_id,
            attempt=attempt,
            result=result,
            transition=transition,
        )
        return _Run(planned, report, (event,))

    async def _invoke(
        self, ctx: MessageContext, payload: bytes, planned: _Planned, guard: Any, attempt: int
    ) -> InvocationResult:
        fn, handler = planned.function, planned.rule.handler
        try:
            env = resolve_environment(planned.template.env, planned.template.secrets, self._secrets)
            request = InvocationRequest(
                function=fn,
                handler=handler,
                event=payload,
                env=env,
                timeout_ns=clamp_timeout_ns(planned.rule.timeout_ns),
                context=ctx.message_id,
                handler_context=HandlerContext(
                    message_id=ctx.message_id,
                    attempt=attempt,
                    occurrence_id=planned.occurrence_id,
                ),
            )
            return await self._runtime.invoke(request, guard=guard)
        except LeaseLost:
            raise
        except RelayError as exc:
            # The attempt was charged at claim; a runtime that could not serve it
            # (engine refused, function removed, missing secret) is a failure.
            return InvocationResult(ok=False, error=failure_message(fn, handler, str(exc)))
        except Exception as exc:  # noqa: BLE001 - an adapter bug is a failed attempt, never a lost message
            # Only the exception's type reaches the ledger and the DLQ: its text
            # may carry anything (a secret's bytes among them).
            self._notify(
                InvocationCrashed(function=fn, handler=handler, message_id=ctx.message_id, exc=exc)
            )
            return InvocationResult(ok=False, error=failure_message(fn, handler, crashed(exc)))

    # --- 4. settle ----------------------------------------------------------------

    def _finish_request(
        self, ctx: MessageContext, token: str, runs: list[_Run], plan: _Plan
    ) -> FinishRequest:
        return FinishRequest(
            context=ctx,
            token=token,
            reports=tuple(r.report for r in runs),
            gates=plan.gates,
            released=plan.released,
            blocked=plan.blocked,
        )

    async def _settle(
        self,
        ctx: MessageContext,
        token: str,
        plan: _Plan,
        statuses: tuple[ClaimStatus, ...],
        runs: list[_Run],
    ) -> MessageReport:
        # The usual path needs no shield of its own: a ledger call, once made,
        # completes even if this task is cancelled meanwhile (the port's promise).
        settled = await self._finish(ctx, self._finish_request(ctx, token, runs, plan))
        if settled is None:
            self._record_breakers(ctx, plan, runs, None)
            for run in runs:
                self._publish(run.events)
            return self._kept(ctx, "finish_failed")
        rejected = set(settled.rejected)
        self._record_breakers(ctx, plan, runs, rejected)
        for run in runs:
            if run.report.field in rejected:
                planned = run.planned
                self._notify(
                    fenced_event(
                        ctx.message_id, planned.function, planned.rule.handler, run.report.attempt
                    )
                )
            else:
                # Published only now: a result the ledger rejected never counted, and
                # an operator must not read a success (or a retry) that did not happen.
                self._publish(run.events)
        # an acknowledged message (the usual case) needs no pending reason
        fallback = (
            ""
            if settled.acknowledged
            else pending_reason(
                statuses, plan.blocked, [r.report for r in runs], waiting=plan.waiting
            )
        )
        outcome = outcome_name(settled, True, fallback)
        self._publish(settlement_events(ctx.message_id, settled, outcome=outcome))
        return self._report(ctx, settled.acknowledged, outcome)

    async def _finish(self, ctx: MessageContext, request: FinishRequest) -> Settlement | None:
        try:
            return await self._ledger.finish(request)
        except DependencyUnavailable as exc:
            # The results are lost; each claim expires at its deadline and the
            # next delivery runs it again (at-least-once).
            self._notify(
                LedgerUnavailable(message_id=ctx.message_id, call="finish", error=str(exc))
            )
            return None

    async def _dead_letter_malformed(
        self, ctx: MessageContext, malformed: Malformed
    ) -> MessageReport:
        self._notify(EventMalformed(message_id=ctx.message_id, reason=malformed.reason))
        request = MalformedRequest(context=ctx, reason=malformed.reason, event=malformed.summary)
        try:
            settlement = await self._ledger.dead_letter_malformed(request)
        except DependencyUnavailable as exc:
            self._notify(
                LedgerUnavailable(message_id=ctx.message_id, call="malformed", error=str(exc))
            )
            return self._kept(ctx, "ledger_unavailable")
        self._publish(settlement_events(ctx.message_id, settlement, outcome="malformed"))
        return self._report(ctx, settlement.acknowledged, "malformed")

    def _admitted(self, ctx: MessageContext, planned: _Planned) -> bool:
        if self._breakers is None:
            return True
        key = _breaker_key(ctx, planned)
        return self._breakers.admit(planned.function, planned.template.breaker, key)

    def _record_breakers(
        self, ctx: MessageContext, plan: _Plan, runs: list[_Run], rejected: set[str] | None
    ) -> None:
        """Each run's result, once the ledger answered, to its function's breaker: a
        result it rejected (fenced) or never received (``rejected`` None) counts as none."""
        breakers = self._breakers
        if breakers is None or not (
            breakers.holding or any(p.template.breaker is not None for p in plan.invocations)
        ):
            return  # the usual case: no breaker involved, nothing to tell
        for run in runs:
            planned = run.planned
            counts = rejected is not None and planned.field not in rejected
            ok = counted_result(run.report.transition) if counts else None
            key = _breaker_key(ctx, planned)
            breakers.record(planned.function, planned.template.breaker, key, ok)

    def _kept(self, ctx: MessageContext, reason: str) -> MessageReport:
        self._notify(MessageKeptPending(message_id=ctx.message_id, reason=reason))
        return self._report(ctx, False, reason)

    @staticmethod
    def _report(ctx: MessageContext, acked: bool, outcome: str) -> MessageReport:
        return MessageReport(message_id=ctx.message_id, acknowledged=acked, outcome=outcome)


def _plan_occurrence(found: Occurrence) -> _Plan:
    """An occurrence plans exactly its schedule's handler (see
    :mod:`relay.application.occurrence_plan`)."""
    match found:
        case OccurrenceWait(occurrence):
            return _Plan(invocations=(), functions=(), occurrence=occurrence, waiting=True)
        case OccurrenceGone(occurrence):
            return _Plan(invocations=(), functions=(), occurrence=occurrence, ended="obsolete")
        case OccurrenceRun(occurrence, fn, rule):
            planned = _Planned(
                occurrence.field, fn.name, rule, fn.template, fn.ready, occurrence.occurrence_id
            )
            return _Plan(
                invocations=(planned,),
                functions=(),
                occurrence=occurrence,
                handler_input=schedule.handler_payload(occurrence),
                skip_overlap=rule.overlap == "skip",
            )
    raise AssertionError(found)


def _breaker_key(ctx: MessageContext, planned: _Planned) -> str:
    return f"{ctx.message_id}/{planned.field}"


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
    return _Run(planned, report, (deferred,))
