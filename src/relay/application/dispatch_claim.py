"""Step 2 of a delivery: claim a whole batch's invocations in one ledger call.

:class:`Claimer` checks ``overlap: skip`` for the occurrences that ask for it,
then sends one ``begin_many`` for every delivery of the batch: it classifies
each message once, claims every eligible matched invocation with the
delivery's fresh random token and a deadline on the ledger's clock, and settles
at once a message for which nothing needs to run. Invocations the ledger
already records but the current rules no longer match come back as
*unplanned*: the planner decides what each is, and a second ``begin_many`` (same
tokens, so safe to repeat) claims or releases them for those messages only
(rare). A claim error fails closed: nothing runs, the messages stay pending.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from relay.application.dispatch_events import newly_exhausted_events
from relay.application.dispatch_plan import Planner, forged, skipped
from relay.application.dispatch_state import Delivery
from relay.application.ports import Clock, InvocationLedger, OccurrenceHistory, TokenSource
from relay.domain import schedule
from relay.domain.errors import DependencyUnavailable
from relay.domain.events import EventClassified, LedgerUnavailable
from relay.domain.messages import DomainEvent

Notify = Callable[[DomainEvent], None]


class Claimer:
    """Claims the invocations of a batch of deliveries (see the module text)."""

    def __init__(
        self,
        *,
        ledger: InvocationLedger,
        planner: Planner,
        clock: Clock,
        tokens: TokenSource,
        notify: Notify,
        history: OccurrenceHistory | None,
    ) -> None:
        self._ledger = ledger
        self._planner = planner
        self._clock = clock
        self._tokens = tokens
        self._notify = notify
        self._history = history

    async def claim(self, deliveries: Sequence[Delivery]) -> None:
        """Set each delivery's ``started`` (``None`` when the ledger could not be
        reached: then nothing was claimed)."""
        for d in deliveries:
            if d.plan.occurrence is not None and d.plan.invocations:
                await self._provenance(d)  # only occurrences pay for it
            if d.plan.skip_overlap:
                await self._overlap(d)
            d.token = self._tokens.token()
            d.request = self._planner.begin_request(d.ctx, d.plan, d.token)
        begun = self._clock.monotonic()
        for d in deliveries:
            d.begun = begun
        try:
            results = await self._ledger.begin_many([d.request for d in deliveries if d.request])
        except DependencyUnavailable as exc:
            self._unavailable(deliveries, exc)
            return
        again: list[Delivery] = []
        for d, started in zip(deliveries, results, strict=True):
            d.started = started
            if started.newly_classified and d.plan.occurrence is None:
                self._notify(
                    EventClassified(
                        message_id=d.message_id,
                        matched=bool(d.plan.invocations),
                        functions=d.plan.functions,
                    )
                )
            if started.unplanned and not started.lost:
                again.append(d)
        if again:
            await self._claim_unplanned(again)
        for d in deliveries:
            if d.started is not None:
                for event in newly_exhausted_events(d.message_id, d.started.statuses):
                    self._notify(event)

    async def _claim_unplanned(self, deliveries: list[Delivery]) -> None:
        """Rare: a second begin with the same tokens (safe to repeat) claims or
        releases what the ledger records beyond the current match."""
        plans = []
        requests = []
        for d in deliveries:
            assert d.started is not None
            plan = self._planner.replan(d.plan, d.started.unplanned)
            plans.append(plan)
            requests.append(self._planner.begin_request(d.ctx, plan, d.token))
        try:
            results = await self._ledger.begin_many(requests)
        except DependencyUnavailable as exc:
            # The first claims stand; the unplanned ones keep the messages pending.
            self._unavailable(deliveries, exc)
            return
        for d, plan, request, started in zip(deliveries, plans, requests, results, strict=True):
            d.plan, d.request, d.started = plan, request, started

    def _unavailable(self, deliveries: Sequence[Delivery], exc: DependencyUnavailable) -> None:
        for d in deliveries:
            self._notify(LedgerUnavailable(message_id=d.message_id, call="begin", error=str(exc)))

    async def _provenance(self, d: Delivery) -> None:
        """An occurrence runs only if it is the entry publish-if-new appended: a copy
        (same occurrence id, another message) is acknowledged unrun (``forged``).
        A broker that cannot tell fails open (it runs: at-least-once first)."""
        occurrence = d.plan.occurrence
        if occurrence is None or self._history is None:
            return
        try:
            recorded = await self._history.published_as(occurrence.occurrence_id)
        except DependencyUnavailable as exc:
            self._notify(
                LedgerUnavailable(message_id=d.message_id, call="provenance", error=str(exc))
            )
            return
        if schedule.is_copy(recorded, d.message_id):
            d.plan = forged(occurrence)

    async def _overlap(self, d: Delivery) -> None:
        """``overlap: skip``: nothing runs while an earlier occurrence of the same
        schedule is not terminal. A broker that cannot tell fails open (it runs:
        at-least-once first)."""
        occurrence = d.plan.occurrence
        if occurrence is None or self._history is None:
            return
        prefix = schedule.schedule_prefix(occurrence.function, occurrence.handler)
        try:
            busy = await self._history.unfinished_before(prefix, d.message_id)
        except DependencyUnavailable as exc:
            self._notify(
                LedgerUnavailable(message_id=d.message_id, call="overlap", error=str(exc))
            )
            return
        if busy:
            d.plan = skipped(occurrence)
