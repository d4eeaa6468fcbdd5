"""The worker as ``composition.compose()`` wires it, on in-memory fakes.

Unit tests that need a worker (or a use case with the commands it sends) build it
here, through the real composition root, instead of wiring a copy of it by hand:
a command added to ``compose()`` is then in every such test at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.adapters.fs.discovery import FsFunctionSource
from relay.application.bus import Audit, MessageBus
from relay.application.composition import Composition, compose
from relay.application.concurrency import Slots
from relay.application.converge import ServiceConvergence
from relay.application.git_sync import GitSyncing, SyncScheduler
from relay.application.ports import (
    CatalogSource,
    Clock,
    FunctionSource,
    GitSyncer,
    OccurrencePublisher,
)
from relay.application.reconcile import Reconciler
from relay.application.registry import FunctionRegistry
from relay.application.scheduler import OccurrencePublishing, Scheduler
from relay.application.services import ServiceConverger
from relay.domain import events as ev
from relay.domain.commands import ConvergeServices, PublishOccurrence, SyncGit
from relay.domain.dead_letters import StoredDeadLetter
from relay.domain.git import GitSyncResult, SyncSummary
from relay.domain.messages import DomainEvent
from tests.fakes import (
    FakeClock,
    InMemoryContainerRuntime,
    InMemoryDeadLetterQueue,
    InMemoryEventStream,
    InMemoryImageBuilder,
    InMemoryLedger,
    InMemoryOccurrencePublisher,
    InMemorySecretStore,
    SequentialTokens,
)


class NoDeadLetters:
    """A dead-letter source with no entry (``relay dlq replay`` finds nothing)."""

    async def get(self, entry_id: str) -> StoredDeadLetter:
        raise LookupError(entry_id)

    async def discard(self, entry_id: str) -> bool:
        return False


class CountingStats:
    """The stats resetter: counts resets."""

    def __init__(self) -> None:
        self.resets = 0

    async def reset(self) -> None:
        self.resets += 1


@dataclass
class FakeWorker:
    """The composed bus and every fake port it was given (tests assert on them)."""

    functions: Path
    clock: FakeClock = field(default_factory=FakeClock)
    audit: Audit | None = None
    services: ServiceConverger | None = None
    git: GitSyncer | None = None
    source: FunctionSource | None = None
    secrets: InMemorySecretStore = field(default_factory=InMemorySecretStore)
    builder: InMemoryImageBuilder = field(default_factory=InMemoryImageBuilder)
    runtime: InMemoryContainerRuntime = field(default_factory=InMemoryContainerRuntime)
    registry: FunctionRegistry = field(default_factory=FunctionRegistry)
    stats: CountingStats = field(default_factory=CountingStats)
    slots: Slots = field(default_factory=lambda: Slots(max_concurrency=8))
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stream = InMemoryEventStream(self.clock)
        self.dlq = InMemoryDeadLetterQueue()
        self.ledger = InMemoryLedger(self.stream, self.dlq, self.clock)
        self.publisher = InMemoryOccurrencePublisher(self.stream, self.clock)
        self.composition: Composition = compose(
            bus=MessageBus({}, audit=self.audit),
            registry=self.registry,
            source=self.source or FsFunctionSource(self.functions),
            builder=self.builder,
            runtime=self.runtime,
            slots=self.slots,
            secrets=self.secrets,
            clock=self.clock,
            tokens=SequentialTokens(),
            stream=self.stream,
            ledger=self.ledger,
            dead_letters=NoDeadLetters(),
            stats=self.stats,
            max_event_bytes=256 * 1024,
            publisher=self.publisher,
            services=self.services,
            git=self.git,
            **self.options,
        )

    @property
    def bus(self) -> MessageBus:
        return self.composition.bus


def scheduler_on(
    bus: MessageBus,
    *,
    registry: CatalogSource,
    publisher: OccurrencePublisher,
    clock: Clock,
    backoff_s: float = 0.0,
) -> Scheduler:
    """One worker's scheduler loop and the ``PublishOccurrence`` handler it sends
    to (registered on ``bus``), as ``compose()`` and ``relay start`` wire them."""
    handler = OccurrencePublishing(publisher=publisher, emit=bus.emit, backoff_s=backoff_s)
    bus.register(PublishOccurrence, handler)
    return Scheduler(registry=registry, clock=clock, send=bus.send)


async def deliver(bus: MessageBus, events: Iterable[DomainEvent]) -> None:
    """Emit ``events`` into the bus's sink and drain it, as a command's end does."""
    for event in events:
        bus.emit(event)
    await bus.drain()


class Syncer:
    """A ``GitSyncer`` over a coroutine function returning a ``SyncSummary``."""

    functions_dir = Path("/functions")

    def __init__(self, sync: Callable[[], Awaitable[SyncSummary]]) -> None:
        self._sync = sync

    async def sync_functions(self) -> GitSyncResult:
        summary = await self._sync()
        return GitSyncResult(
            repository="git@example.invalid:o/r.git", ref="main", commit=summary.commit,
            directory=str(self.functions_dir), functions=["fn"] * summary.functions,
        )


def sync_loop(
    sync: Callable[[], Awaitable[SyncSummary]], emit: Callable[[DomainEvent], None],
    bus: MessageBus | None = None,
) -> SyncScheduler:
    """The webhook's loop sending ``SyncGit`` to its handler on ``bus``, as
    ``relay start`` wires them; ``emit`` sees every fact."""
    bus = bus or MessageBus({})
    bus.subscribe(ev.GitSyncFinished, emit)
    bus.register(SyncGit, GitSyncing(syncer=Syncer(sync), emit=bus.emit))
    return SyncScheduler(bus.send)


def reconciler_on(bus: MessageBus, **ports: Any) -> Reconciler:
    """A reconciler whose commands (``ReconcileFunction``, ``ReconcileAll``, and the
    ``ConvergeServices`` it sends) are handled on ``bus``, as ``compose()`` wires
    them; for tests that hold real adapters (Docker) instead of the fakes."""
    reconciler = Reconciler(emit=bus.emit, send=bus.send, **ports)
    for command, handler in reconciler.handlers().items():
        bus.register(command, handler)
    services = ports.get("services")
    convergence = ServiceConvergence(registry=reconciler.registry, services=services,
                                     emit=bus.emit)
    bus.register(ConvergeServices, convergence)
    return reconciler
