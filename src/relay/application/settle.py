"""Step 4 of a delivery, the one place a message is settled.

A message settles in one of three ways, all here: at its ``begin`` (nothing
needed to run: :meth:`Settler.at_begin`), after its attempts (:meth:`Settler.
add`), or not at all (the ledger could not be reached: :meth:`Settler.kept`).

After its attempts, a delivery's :class:`~relay.domain.outcome.FinishRequest` joins
the open *group*; a group is flushed with ONE ``finish_many`` (one script call on
Redis, one transaction on SQLite: every result fenced by its token, each
message's DLQ entries first, then the acknowledgement of every message that
became terminal) when it holds :data:`GROUP_MAX` requests or :data:`GROUP_WAIT_S`
after its first request joined, whichever comes first. The bounds:

- 1 ms: at 2,000 to 6,000 events/s a group then gathers 2 to 6 finishes (one call
  instead of as many), and the added XADD-to-XACK latency stays a third of the
  3 ms p99 goal; a handler that returns later joins a later group, so a slow
  invocation never holds back another message's acknowledgement;
- 64 requests: one ``finish`` costs Redis about 35 us, so a full group holds the
  server for about 2 ms, the most one call may keep every other client waiting;
  it also bounds the call's size (the longest argument list Redis is sent).

The group's timer is the sleep of the task whose finish opened the group (one
timer per group, no task of the settler's own); a cancelled sleep (shutdown)
flushes at once, shielded and bounded, so results that ran are recorded. Every
delivery of a flushed group ends, whatever the call's fate (a failed or
cancelled call ends them as not recorded: they stay pending).
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import structlog

from relay.application.breakers import BreakerBoard, counted_result
from relay.application.dispatch_attempt import breaker_key
from relay.application.dispatch_events import (
    ended_event,
    fenced_event,
    outcome_name,
    pending_reason,
    settlement_events,
)
from relay.application.dispatch_state import Delivery, Run
from relay.application.ports import InvocationLedger
from relay.domain.errors import DependencyUnavailable
from relay.domain.events import LedgerUnavailable, MessageKeptPending
from relay.domain.message_outcomes import Unsettled
from relay.domain.messages import DomainEvent
from relay.domain.outcome import FinishRequest, Settlement

Notify = Callable[[DomainEvent], None]

GROUP_MAX = 64
GROUP_WAIT_S = 0.001
CLEANUP_S = 5.0  # a shielded flush on the way out (shutdown) is bounded by this

_log = structlog.get_logger(__name__)


class _Finished:
    __slots__ = ("delivery", "request", "runs")

    def __init__(self, delivery: Delivery, runs: list[Run], request: FinishRequest) -> None:
        self.delivery = delivery
        self.runs = runs
        self.request = request


class Settler:
    """Settles deliveries in groups (see the module text)."""

    def __init__(
        self,
        *,
        ledger: InvocationLedger,
        notify: Notify,
        breakers: BreakerBoard | None,
        group_max: int = GROUP_MAX,
        group_wait_s: float = GROUP_WAIT_S,
    ) -> None:
        self._ledger = ledger
        self._notify = notify
        self._breakers = breakers
        self._group_max = max(1, group_max)
        self._group_wait_s = group_wait_s
        self._open: list[_Finished] = []
        self._timer = False  # a task is sleeping the open group's wait

    # --- after the attempts -------------------------------------------------------------

    async def add(self, d: Delivery, runs: list[Run]) -> None:
        """Queue the delivery's results; returns once they are queued, or once the
        group this call opened was flushed (the caller's task is its timer)."""
        self._open.append(_Finished(d, runs, _finish_request(d, runs)))
        if len(self._open) >= self._group_max or self._breaker_involved(d):
            # A breaker learns a result once the ledger recorded it: invocations
            # queued for a slot must not wait a group's timer to be held.
            await self._flush()
            return
        if self._timer:
            return
        self._timer = True
        try:
            await anyio.sleep(self._group_wait_s)
        except BaseException:
            # cancelled (shutdown): what ran is recorded before the task ends
            self._timer = False
            with anyio.CancelScope(shield=True, deadline=anyio.current_time() + CLEANUP_S):
                await self._flush()
            raise
        self._timer = False
        await self._flush()

    async def now(self, d: Delivery, runs: list[Run]) -> None:
        """Settle at once, shielded and bounded (a cancelled delivery's way out)."""
        self._open.append(_Finished(d, runs, _finish_request(d, runs)))
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + CLEANUP_S):
            await self._flush()

    async def _flush(self) -> None:
        group, self._open = self._open, []
        if not group:
            return
        settled: list[Settlement] | list[None] = [None] * len(group)
        try:
            settled = await self._ledger.finish_many([f.request for f in group])
        except DependencyUnavailable as exc:
            # The results are lost; each claim expires at its deadline and the
            # next delivery runs it again (at-least-once).
            for f in group:
                self._notify(
                    LedgerUnavailable(message_id=f.delivery.message_id, call="finish",
                                      error=str(exc))
                )
        except Exception:  # noqa: BLE001 - an adapter bug: the messages stay pending
            _log.exception("finish_failed", count=len(group))
        finally:
            # Every delivery of the group ends here, even when the call was cancelled
            # (then as not recorded): a batch waits for each of its deliveries.
            for f, settlement in zip(group, settled, strict=True):
                self._settled(f.delivery, f.runs, settlement)

    def _settled(self, d: Delivery, runs: list[Run], settled: Settlement | None) -> None:
        if settled is None:
            self._record_breakers(d, runs, None)
            for run in runs:
                self._publish(run.events)
            self.kept(d, Unsettled.FINISH_FAILED)
            return
        rejected = set(settled.rejected)
        self._record_breakers(d, runs, rejected)
        message_id = d.message_id
        for run in runs:
            if run.report.field in rejected:
                planned = run.planned
                self._notify(
                    fenced_event(message_id, planned.function, planned.rule.handler,
                                 run.report.attempt)
                )
            else:
                # Published only now: a result the ledger rejected never counted, and
                # an operator must not read a success (or a retry) that did not happen.
                self._publish(run.events)
        plan = d.plan
        # an acknowledged message (the usual case) needs no pending reason
        statuses = d.started.statuses if d.started is not None else ()
        fallback = (
            ""
            if settled.acknowledged
            else pending_reason(
                statuses, plan.blocked, [r.report for r in runs], waiting=plan.waiting
            )
        )
        outcome = outcome_name(settled, True, fallback)
        self._publish(settlement_events(message_id, settled, outcome=outcome))
        d.end(settled.acknowledged, outcome)

    # --- without attempts ---------------------------------------------------------------

    def at_begin(self, d: Delivery) -> None:
        """Nothing ran: the ``begin`` settled the message if it could."""
        assert d.started is not None
        plan, started = d.plan, d.started
        settlement = started.settlement
        waiting = pending_reason(started.statuses, plan.blocked, waiting=plan.waiting)
        outcome = outcome_name(settlement, bool(plan.invocations), waiting)
        if plan.ended and settlement.acknowledged and not settlement.dead_lettered:
            outcome = plan.ended
            self._notify(ended_event(d.message_id, plan.occurrence, plan.ended))
        self._publish(settlement_events(d.message_id, settlement, outcome=outcome))
        d.end(settlement.acknowledged, outcome)

    def kept(self, d: Delivery, reason: str) -> None:
        """The message stays pending (the ledger could not be reached)."""
        self._notify(MessageKeptPending(message_id=d.message_id, reason=reason))
        d.end(False, reason)

    def malformed(self, d: Delivery, settlement: Settlement) -> None:
        self._publish(settlement_events(d.message_id, settlement, outcome=Unsettled.MALFORMED))
        d.end(settlement.acknowledged, Unsettled.MALFORMED)

    # --- shared -------------------------------------------------------------------------

    def _publish(self, events: list[DomainEvent] | tuple[DomainEvent, ...]) -> None:
        for event in events:
            self._notify(event)

    def _breaker_involved(self, d: Delivery) -> bool:
        breakers = self._breakers
        return breakers is not None and (
            breakers.holding or any(p.template.breaker is not None for p in d.plan.invocations)
        )

    def _record_breakers(self, d: Delivery, runs: list[Run], rejected: set[str] | None) -> None:
        """Each run's result, once the ledger answered, to its function's breaker: a
        result it rejected (fenced) or never received (``rejected`` None) counts as none."""
        breakers = self._breakers
        if breakers is None or not self._breaker_involved(d):
            return  # the usual case: no breaker involved, nothing to tell
        for run in runs:
            planned = run.planned
            counts = rejected is not None and planned.field not in rejected
            ok = counted_result(run.report.transition) if counts else None
            key = breaker_key(d.ctx, planned)
            breakers.record(planned.function, planned.template.breaker, key, ok)


def _finish_request(d: Delivery, runs: list[Run]) -> FinishRequest:
    plan = d.plan
    return FinishRequest(
        context=d.ctx,
        token=d.token,
        reports=tuple(r.report for r in runs),
        gates=plan.gates,
        released=plan.released,
        blocked=plan.blocked,
    )
