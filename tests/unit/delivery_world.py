"""A whole delivery path on in-memory fakes: stream, ledger, DLQ, registry, runtime."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from relay.application.bus import MessageBus
from relay.application.composition import compose
from relay.application.concurrency import Slots
from relay.application.dispatch import MessageReport
from relay.application.ports import SecretStore
from relay.application.registry import ActiveFunction, FunctionRegistry
from relay.domain import events as ev
from relay.domain.commands import DispatchBatch, DispatchMessage
from relay.domain.messages import DomainEvent
from relay.domain.outcome import StreamMessage
from relay.domain.template import parse_template
from tests.fakes import (
    FakeClock,
    InMemoryContainerRuntime,
    InMemoryDeadLetterQueue,
    InMemoryEventStream,
    InMemoryFunctionSource,
    InMemoryImageBuilder,
    InMemoryLedger,
    InMemoryOccurrenceHistory,
    InMemoryOccurrencePublisher,
    InMemorySecretStore,
    SequentialTokens,
)
from tests.fakes_compose import CountingStats, NoDeadLetters

E = TypeVar("E", bound=DomainEvent)

DELIVERY_EVENTS: tuple[type[DomainEvent], ...] = (
    ev.EventClassified,
    ev.InvocationStarted,
    ev.InvocationSucceeded,
    ev.InvocationFailed,
    ev.InvocationExhausted,
    ev.InvocationDeferred,
    ev.InvocationFenced,
    ev.MessageDeadLettered,
    ev.DeadLetterWriteFailed,
    ev.MessageAcknowledged,
    ev.MessageKeptPending,
    ev.PendingEntryDropped,
    ev.LeaseRenewed,
    ev.EventMalformed,
    ev.LedgerUnavailable,
    ev.InvocationCrashed,
    ev.OccurrenceObsolete,
    ev.OccurrenceSkipped,
    ev.OccurrenceForged,
    ev.BreakerOpened,
    ev.BreakerHalfOpened,
    ev.BreakerClosed,
)


class World:
    """The worker as ``composition.compose()`` wires it, on in-memory fakes of every
    port; ``registry``: one of the test's (by default every function of the world
    is declared, as after a first full scan)."""

    def __init__(
        self,
        *,
        max_event_bytes: int = 1024,
        slot_wait_s: float = 0.05,
        secrets: SecretStore | None = None,
        registry: FunctionRegistry | None = None,
    ) -> None:
        self.clock = FakeClock()
        self.stream = InMemoryEventStream(self.clock)
        self.dlq = InMemoryDeadLetterQueue()
        self.ledger = InMemoryLedger(self.stream, self.dlq, self.clock)
        if registry is None:
            registry = FunctionRegistry()
            registry.mark_complete()  # every function of the world is declared
        self.registry = registry
        self.runtime = InMemoryContainerRuntime(self.clock)
        self.slots = Slots(8, wait_s=slot_wait_s)
        self.secrets = InMemorySecretStore()
        self.publisher = InMemoryOccurrencePublisher(self.stream, self.clock)
        self.history = InMemoryOccurrenceHistory(self.stream, self.ledger, self.publisher)
        self.bus = MessageBus({})
        composition = compose(
            bus=self.bus,
            registry=self.registry,
            source=InMemoryFunctionSource(),
            builder=InMemoryImageBuilder(),
            runtime=self.runtime,
            slots=self.slots,
            secrets=secrets if secrets is not None else self.secrets,
            clock=self.clock,
            tokens=SequentialTokens(),
            stream=self.stream,
            ledger=self.ledger,
            dead_letters=NoDeadLetters(),
            stats=CountingStats(),
            max_event_bytes=max_event_bytes,
            publisher=self.publisher,
            slot_wait_s=slot_wait_s,
            history=self.history,
        )
        self.dispatcher = composition.dispatcher
        self.breakers = composition.breakers
        self.events: list[DomainEvent] = []
        for kind in DELIVERY_EVENTS:
            self.bus.subscribe(kind, self.events.append)

    def function(self, name: str, template: dict[str, Any], *, image: str | None = "img") -> None:
        parsed = parse_template({"runtime": "python3.14", **template})
        self.registry.put(
            ActiveFunction(
                name=name,
                directory=f"/functions/{name}",
                template=parsed,
                runtime="python3.14",
                image=image,
                fingerprint=None,
                prepared_at=None,
            )
        )
        if image is not None:
            self.runtime.activate(name, image, "python3.14", parsed.concurrency)
            self.slots.resize(name, parsed.concurrency)

    async def deliver(self, payload: bytes | None) -> MessageReport:
        self.stream.add(payload)
        [message] = await self.stream.read(1, 0)
        return await self.dispatch(message)

    async def dispatch(self, message: StreamMessage) -> MessageReport:
        report: MessageReport = await self.bus.send(DispatchMessage(message=message))
        return report

    async def dispatch_batch(
        self, messages: Sequence[StreamMessage], done: Callable[[str], None] | None = None
    ) -> list[MessageReport]:
        """What the loops call: the whole read as one batch."""
        reports: list[MessageReport] = await self.bus.send(
            DispatchBatch(messages=tuple(messages), done=done)
        )
        return reports

    async def redeliver(self, message_id: str) -> MessageReport:
        """What the recovery loop does once the message has been idle long enough."""
        info = self.stream.pending[message_id]
        info.count += 1
        message = StreamMessage(
            id=message_id,
            payload=self.stream.entries[message_id],
            deliveries=info.count,
            reclaimed=True,
        )
        return await self.dispatch(message)

    def expire_deadlines(self, message_id: str) -> None:
        """Rewrite every running/backoff deadline of the message into the past."""
        h = self.ledger.hashes[message_id]
        for field, value in list(h.items()):
            kind, _, rest = value.partition(":")
            if kind in ("running", "next_attempt_at"):
                h[field] = f"{kind}:1000#{rest.split('#', 1)[1]}"

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]

    def handlers_run(self) -> list[str]:
        return [f"{r.function}/{r.handler}" for r in self.runtime.requests]


def rule(handler: str, pattern: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"handler": handler, "pattern": pattern, **extra}
