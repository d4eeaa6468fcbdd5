"""What the dispatch pipeline's units hand each other about one read batch.

A :class:`Delivery` is one message on its way through plan, claim, attempt and
settle (:mod:`relay.application.dispatch`); a :class:`Batch` counts the batch's
deliveries still open, hands each one's end to the caller as it happens (so a
slow invocation never holds another message's buffer place) and wakes the
batch's one waiter when the last one ends: one wake-up per batch, not one future
per message.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import msgspec

from relay.application.dispatch_plan import Plan, Planned
from relay.domain.messages import DomainEvent
from relay.domain.outcome import (
    AttemptReport,
    BeginRequest,
    BeginResult,
    MessageContext,
)

Done = Callable[[str], None]


class MessageReport(msgspec.Struct, frozen=True, kw_only=True):
    """The result of one dispatch: acknowledged or left pending (and why)."""

    message_id: str
    acknowledged: bool
    outcome: str


class Run(msgspec.Struct, frozen=True):
    """One claim's end: its attempt (or release) report and what it publishes once
    the ledger recorded the report."""

    planned: Planned  # the invocation this attempt (or release) was of
    report: AttemptReport
    events: tuple[DomainEvent, ...]


class Batch:
    """The deliveries of one read batch still open (see the module text)."""

    __slots__ = ("_done", "_ended", "_open", "reports")

    def __init__(self, size: int, done: Done | None) -> None:
        self._open = size
        self._done = done
        self._ended: anyio.Event | None = None
        self.reports: list[MessageReport | None] = [None] * size

    def end(self, index: int, report: MessageReport) -> None:
        if self.reports[index] is not None:
            return  # ended already (a shielded settle after a cancellation)
        self.reports[index] = report
        if self._done is not None:
            self._done(report.message_id)
        self._open -= 1
        if self._open == 0 and self._ended is not None:
            self._ended.set()

    async def wait(self) -> None:
        if self._open > 0:
            self._ended = anyio.Event()
            await self._ended.wait()


class Delivery:
    """One message of a batch between its plan and its settlement."""

    __slots__ = (
        "batch", "begun", "ctx", "index", "payload", "plan", "request", "started", "token",
    )

    def __init__(
        self, batch: Batch, index: int, ctx: MessageContext, payload: bytes, plan: Plan
    ) -> None:
        self.batch = batch
        self.index = index
        self.ctx = ctx
        self.payload = payload  # what the handlers read
        self.plan = plan
        self.token = ""
        self.begun = 0.0  # local monotonic time the begin was sent (the leases' start)
        self.request: BeginRequest | None = None
        self.started: BeginResult | None = None  # None: the claim failed

    @property
    def message_id(self) -> str:
        return self.ctx.message_id

    def end(self, acknowledged: bool, outcome: str) -> None:
        report = MessageReport(
            message_id=self.ctx.message_id, acknowledged=acknowledged, outcome=outcome
        )
        self.batch.end(self.index, report)
