"""The DispatchMessage / DispatchBatch use case: read messages through the ledger.

A read batch of messages takes four steps, each its own unit with one job and
each publishing its own domain events as it happens (log lines come from one
subscriber of those events, :mod:`relay.application.delivery_log`):

1. **plan** (:mod:`~relay.application.dispatch_plan`, pure): every message is
   decoded and matched into an event plan, an occurrence plan, or malformed
   (dead-lettered at once);
2. **claim** (:mod:`~relay.application.dispatch_claim`): ONE ``begin_many``
   classifies every message of the batch once and claims every eligible
   invocation (a message with nothing to run settles right there);
3. **attempt** (:mod:`~relay.application.dispatch_attempt`): the deliveries with
   claims run concurrently within the concurrency slots, each its own claims one
   at a time (the spec's order), each lease covering a cold start;
4. **settle** (:mod:`~relay.application.settle`, the one place a message
   settles): finished deliveries are settled in groups by ONE ``finish_many``
   (results fenced by token, DLQ entries, then the acknowledgement of every
   terminal message), when a group fills or a short timer fires.

A claim that never ran (no slot within the bounded wait, a lease that could not
be renewed, shutdown) is *released* to the marker it replaced, so no attempt is
charged. A claim error fails closed: nothing runs and the message stays pending.
:class:`MessageDispatcher` is only the composition of the four.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import anyio

from relay.application.breakers import BreakerBoard
from relay.application.bus import Outcome
from relay.application.dispatch_attempt import Attempter
from relay.application.dispatch_claim import Claimer
from relay.application.dispatch_plan import Plan, Planner
from relay.application.dispatch_state import Batch, Delivery, Done, MessageReport, Run
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
from relay.application.settle import GROUP_MAX, GROUP_WAIT_S, Settler
from relay.domain.commands import DispatchBatch, DispatchMessage
from relay.domain.errors import DependencyUnavailable
from relay.domain.events import DeliveryLost, EventMalformed, LedgerUnavailable
from relay.domain.message_outcomes import Released
from relay.domain.messages import DomainEvent
from relay.domain.outcome import Malformed, MalformedRequest, MessageContext, StreamMessage, rfc3339

__all__ = ["LEASE_GRACE_MS", "MessageDispatcher", "MessageReport"]

Notify = Callable[[DomainEvent], None]

# Each claim's lease adds this to the rule timeout: the container's own kill
# grace and the round trips around the run.
LEASE_GRACE_MS = 5_000


_NONE = Plan(invocations=(), functions=())  # a malformed message's (it has no plan)


def _discard(_event: DomainEvent) -> None:
    return None


class MessageDispatcher:
    """Handler of :class:`DispatchBatch` and :class:`DispatchMessage` (a batch of
    one); register both on the bus (:meth:`handle_batch` and the instance).

    ``notify`` receives every domain event as it happens (the bus's ``notify``);
    the :class:`Outcome` carries none, so nothing is published twice.
    ``history`` answers ``overlap: skip`` (without one, occurrences overlap);
    ``breakers`` holds invocations of functions whose breaker is open.
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
        settle_group: int = GROUP_MAX,
        settle_wait_s: float = GROUP_WAIT_S,
    ) -> None:
        self._stream = stream
        self._ledger = ledger
        self._clock = clock
        self._notify = notify
        pad_ms = int(slot_wait_s * 1000) + lease_grace_ms
        self._planner = Planner(registry, clock, max_event_bytes=max_event_bytes, pad_ms=pad_ms)
        self._claimer = Claimer(
            ledger=ledger, planner=self._planner, clock=clock, tokens=tokens, notify=notify,
            history=history,
        )
        self._attempter = Attempter(
            ledger=ledger, runtime=runtime, slots=slots, secrets=secrets, clock=clock,
            notify=notify, grace_ms=lease_grace_ms, breakers=breakers,
        )
        self._settler = Settler(
            ledger=ledger, notify=notify, breakers=breakers, group_max=settle_group,
            group_wait_s=settle_wait_s,
        )

    async def __call__(self, command: DispatchMessage) -> Outcome[MessageReport]:
        reports = await self.dispatch((command.message,))
        return Outcome(reports[0])

    async def handle_batch(self, command: DispatchBatch) -> Outcome[list[MessageReport]]:
        return Outcome(await self.dispatch(command.messages, command.done))

    async def dispatch(
        self, messages: Sequence[StreamMessage], done: Done | None = None
    ) -> list[MessageReport]:
        """Every message through plan, claim, attempt and settle; ``done`` is told
        each message's id as its dispatch ends. Returns once every one ended."""
        batch = Batch(len(messages), done)
        deliveries = await self._plan(batch, messages)
        if deliveries:
            await self._claimer.claim(deliveries)
            running = [d for d in deliveries if self._settle_unrun(d)]
            if len(running) == 1:
                await self._attempt(running[0])
            elif running:
                await self._attempt_all(running)
        await batch.wait()
        return [r for r in batch.reports if r is not None]

    async def _plan(self, batch: Batch, messages: Sequence[StreamMessage]) -> list[Delivery]:
        """Plan every message; a malformed one is dead-lettered at once."""
        deliveries: list[Delivery] = []
        stamp = rfc3339(self._clock.now())
        stream = self._stream
        for index, message in enumerate(messages):
            ctx = MessageContext(
                stream=stream.stream,
                group=stream.group,
                consumer=stream.consumer,
                message_id=message.id,
                timestamp=stamp,
                delivery=message.delivery,
                traceparent=message.traceparent,
            )
            plan = self._planner.plan(message.payload, reclaimed=message.reclaimed)
            if isinstance(plan, Malformed):
                await self._dead_letter_malformed(Delivery(batch, index, ctx, b"", _NONE), plan)
                continue
            deliveries.append(Delivery(batch, index, ctx, message.payload or b"", plan))
        return deliveries

    def _settle_unrun(self, d: Delivery) -> bool:
        """Settle a delivery with nothing to run here; whether it has claims to run."""
        started = d.started
        if started is None:
            # Fail closed: nothing runs, nothing is counted, the message stays pending.
            self._settler.kept(d, "claim_failed")
            return False
        if started.lost:
            # Another consumer holds the delivery now: it settles the message.
            self._notify(DeliveryLost(message_id=d.message_id))
            d.end(False, "lost")
            return False
        if not self._attempter.claimed(d):
            self._settler.at_begin(d)
            return False
        return True

    async def _attempt_all(self, running: list[Delivery]) -> None:
        """The deliveries' attempts concurrently: the first in this task, each other
        in a plain asyncio task (an anyio task group's spawn was over half the
        dispatcher's own CPU per event, bench/dispatch_cpu.py). This task waits
        for them all; when it is cancelled it cancels them, and each settles what
        ran before it ends."""
        loop = asyncio.get_running_loop()
        others = [loop.create_task(self._attempt(d)) for d in running[1:]]
        try:
            await self._attempt(running[0])
            for task in others:
                await asyncio.shield(task)
        except BaseException:
            for task in others:
                task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(*others, return_exceptions=True)
            raise
        for task in others:
            task.result()  # an attempt's own error (never a handler's: those are results)

    async def _attempt(self, d: Delivery) -> None:
        claimed = self._attempter.claimed(d)
        runs: list[Run] = []
        try:
            await self._attempter.run(d, claimed, runs)
        except BaseException:
            # Shutdown (or any error) before a claim ran to its end releases it: no
            # attempt charged. What did run is still recorded, shielded and bounded.
            self._attempter.release_rest(d, claimed, runs, Released.SHUTDOWN)
            await self._settler.now(d, runs)
            raise
        await self._settler.add(d, runs)

    async def _dead_letter_malformed(self, d: Delivery, malformed: Malformed) -> None:
        ctx = d.ctx
        self._notify(EventMalformed(message_id=ctx.message_id, reason=malformed.reason))
        request = MalformedRequest(context=ctx, reason=malformed.reason, event=malformed.summary)
        try:
            settlement = await self._ledger.dead_letter_malformed(request)
        except DependencyUnavailable as exc:
            self._notify(
                LedgerUnavailable(message_id=ctx.message_id, call="malformed", error=str(exc))
            )
            self._settler.kept(d, "ledger_unavailable")
            return
        self._settler.malformed(d, settlement)
