"""Step 3 of a delivery: run its claimed invocations, one at a time.

:class:`Attempter` runs a delivery's claims in the spec's order, each in a global
then a function concurrency slot (deliveries of a batch run concurrently, each
its own claims in turn). Right before a handler starts, its claim's remaining
lease is checked against its timeout and renewed when it would not cover it (a
slow cold start). A claim that never ran (no slot within the bounded wait, a
lease that could not be renewed, an open breaker) becomes a *release* report:
the marker goes back to what it was and no attempt is charged. Every run
becomes a :class:`~relay.application.dispatch_state.Run` for the settler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relay.application.breakers import BreakerBoard
from relay.application.dispatch_events import result_event
from relay.application.dispatch_lease import Lease, Leases
from relay.application.dispatch_plan import Planned
from relay.application.dispatch_state import Delivery, Run
from relay.application.environment import resolve_environment
from relay.application.log_context import log_context
from relay.application.ports import Clock, InvocationLedger, Invoker, SecretStore, SlotPool
from relay.domain.errors import RelayError
from relay.domain.events import InvocationCrashed, InvocationDeferred
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
)
from relay.domain.message_outcomes import Released
from relay.domain.messages import DomainEvent
from relay.domain.outcome import CLAIMED, AttemptReport, ClaimStatus, MessageContext

Notify = Callable[[DomainEvent], None]


class Attempter:
    """Runs the claims of one delivery (see the module text)."""

    def __init__(
        self,
        *,
        ledger: InvocationLedger,
        runtime: Invoker,
        slots: SlotPool,
        secrets: SecretStore,
        clock: Clock,
        notify: Notify,
        grace_ms: int,
        breakers: BreakerBoard | None,
    ) -> None:
        self._ledger = ledger
        self._runtime = runtime
        self._slots = slots
        self._secrets = secrets
        self._clock = clock
        self._notify = notify
        self._grace_ms = grace_ms
        self._breakers = breakers

    @staticmethod
    def claimed(d: Delivery) -> list[ClaimStatus]:
        """The delivery's claims this worker must run (none: it settled at begin)."""
        started = d.started
        if started is None:
            return []
        return [s for s in started.statuses if s.status == CLAIMED]

    async def run(self, d: Delivery, claimed: list[ClaimStatus], runs: list[Run]) -> None:
        """Append a :class:`Run` per claim to ``runs`` as each ends (a caller that
        is cancelled meanwhile releases the rest: :meth:`release_rest`)."""
        assert d.request is not None
        leases = Leases(d.begun, {c.field: c.lease_ms for c in d.request.claims})
        by_field = {p.field: p for p in d.plan.invocations}
        payload = d.plan.handler_input if d.plan.handler_input is not None else d.payload
        for status in claimed:
            lease = Lease(
                renew=self._ledger.renew,
                clock=self._clock,
                notify=self._notify,
                grace_ms=self._grace_ms,
                ctx=d.ctx,
                token=d.token,
                status=status,
                leases=leases,
            )
            runs.append(await self._attempt(d.ctx, payload, by_field[status.field], status, lease))

    @staticmethod
    def release_rest(
        d: Delivery, claimed: list[ClaimStatus], runs: list[Run], reason: str
    ) -> None:
        """Shutdown (or any error) before a claim ran to its end releases it: no
        attempt charged."""
        by_field = {p.field: p for p in d.plan.invocations}
        for status in claimed[len(runs) :]:
            runs.append(released(d.ctx, by_field[status.field], status, reason))

    async def _attempt(
        self,
        ctx: MessageContext,
        payload: bytes,
        planned: Planned,
        status: ClaimStatus,
        lease: Lease,
    ) -> Run:
        fn, handler, attempt = planned.function, planned.rule.handler, status.attempt
        timeout_ns = clamp_timeout_ns(planned.rule.timeout_ns)
        with log_context(message_id=ctx.message_id, function=fn, handler=handler, attempt=attempt):
            try:
                async with self._slots.acquire(fn):
                    # Asked only once a slot is held: invocations queued for the slot
                    # when the breaker opens must not all run against a dead downstream.
                    if not self._admitted(ctx, planned):
                        return released(ctx, planned, status, Released.BREAKER_OPEN)
                    result = await self._invoke(
                        ctx, payload, planned, lease.guard(timeout_ns), attempt
                    )
            except SlotUnavailable:
                return released(ctx, planned, status, Released.SLOT_UNAVAILABLE)
            except LeaseLost as exc:
                return released(ctx, planned, status, exc.reason)
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
        return Run(planned, report, (event,))

    async def _invoke(
        self, ctx: MessageContext, payload: bytes, planned: Planned, guard: Any, attempt: int
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
                    traceparent=ctx.traceparent,  # the tracer's wrapper puts its own
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

    def _admitted(self, ctx: MessageContext, planned: Planned) -> bool:
        if self._breakers is None:
            return True
        key = breaker_key(ctx, planned)
        return self._breakers.admit(planned.function, planned.template.breaker, key)


def breaker_key(ctx: MessageContext, planned: Planned) -> str:
    return f"{ctx.message_id}/{planned.field}"


def released(ctx: MessageContext, planned: Planned, status: ClaimStatus, reason: str) -> Run:
    report = AttemptReport(
        field=planned.field, attempt=status.attempt, transition=Release(status.previous)
    )
    deferred = InvocationDeferred(
        function=planned.function,
        handler=planned.rule.handler,
        message_id=ctx.message_id,
        reason=reason,
    )
    return Run(planned, report, (deferred,))
