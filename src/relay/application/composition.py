"""The composition root of the use cases: :func:`compose` registers exactly one
handler per command on the bus, wired to ports only (no adapter, no I/O), so the
worker (``relay.bootstrap.build_worker``, with the real adapters) and the unit
tier (with in-memory fakes) run the same wiring.
"""

from __future__ import annotations

from dataclasses import dataclass

from relay.application.breakers import BreakerBoard, subscribe_breaker_log
from relay.application.bus import Handler, MessageBus
from relay.application.concurrency import Slots
from relay.application.control import ControlHandlers, WorkerHealth
from relay.application.converge import ServiceConvergence
from relay.application.delivery_log import subscribe_delivery_log
from relay.application.dispatch import MessageDispatcher
from relay.application.git_sync import GitSyncing
from relay.application.invoke import FunctionInvoker
from relay.application.ports import (
    Clock,
    ContainerRuntime,
    DeadLetterSource,
    EventStream,
    FunctionSource,
    GitSyncer,
    ImageBuilder,
    InvocationLedger,
    Invoker,
    OccurrenceHistory,
    OccurrencePublisher,
    SecretStore,
    StatsResetter,
    TokenSource,
)
from relay.application.reconcile import Reconciler
from relay.application.registry import FunctionRegistry
from relay.application.replay import DeadLetterReplayer
from relay.application.scheduler import OccurrencePublishing
from relay.application.services import ServiceConverger
from relay.domain import commands as cmd
from relay.domain.messages import Command


@dataclass
class Composition:
    """The bus and the use-case objects the loops need."""

    bus: MessageBus
    registry: FunctionRegistry
    reconciler: Reconciler
    health: WorkerHealth
    dispatcher: MessageDispatcher  # what DispatchBatch/DispatchMessage run (tests read it)
    breakers: BreakerBoard


def compose(
    *,
    bus: MessageBus,
    registry: FunctionRegistry,
    source: FunctionSource,
    builder: ImageBuilder,
    runtime: ContainerRuntime,
    slots: Slots,
    secrets: SecretStore,
    clock: Clock,
    tokens: TokenSource,
    stream: EventStream,
    ledger: InvocationLedger,
    dead_letters: DeadLetterSource,
    stats: StatsResetter,
    max_event_bytes: int,
    publisher: OccurrencePublisher,
    slot_wait_s: float = 10.0,
    history: OccurrenceHistory | None = None,
    services: ServiceConverger | None = None,
    dispatch_runtime: Invoker | None = None,
    git: GitSyncer | None = None,
) -> Composition:
    """Register exactly one handler per command on ``bus``; every use case emits
    into the bus's one sink (``bus.emit``) and orders the changes it decides with
    ``bus.send``.

    The bus is created by the caller first so adapters that emit events (the
    runtime's pool events) can be given ``bus.emit`` before they exist here.
    ``dispatch_runtime`` runs delivery's attempts (the traced wrapper of
    ``runtime`` when tracing is on; by default ``runtime`` itself).
    """
    emit = bus.emit
    breakers = BreakerBoard(clock=clock, registry=registry, emit=emit)
    for kind, handler in breakers.table().items():
        bus.register(kind, handler)
    subscribe_breaker_log(bus)
    reconciler = Reconciler(
        registry=registry,
        source=source,
        builder=builder,
        runtime=runtime,
        slots=slots,
        clock=clock,
        emit=emit,
        send=bus.send,
        services=services,
        breakers=breakers,
    )
    for kind, handler in reconciler.handlers().items():
        bus.register(kind, handler)
    bus.register(
        cmd.ConvergeServices, ServiceConvergence(registry=registry, services=services, emit=emit)
    )
    dispatcher = MessageDispatcher(
        stream=stream,
        ledger=ledger,
        registry=registry,
        runtime=runtime if dispatch_runtime is None else dispatch_runtime,
        slots=slots,
        secrets=secrets,
        clock=clock,
        tokens=tokens,
        max_event_bytes=max_event_bytes,
        slot_wait_s=slot_wait_s,
        notify=emit,
        history=history,
        breakers=breakers,
    )
    bus.register(cmd.DispatchMessage, dispatcher)
    bus.register(cmd.DispatchBatch, dispatcher.handle_batch)
    subscribe_delivery_log(bus)
    for kind, handler in _operator_handlers(
        bus, registry=registry, runtime=runtime, slots=slots, secrets=secrets, clock=clock,
        tokens=tokens, dead_letters=dead_letters,
    ).items():
        bus.register(kind, handler)
    bus.register(cmd.PublishOccurrence, OccurrencePublishing(publisher=publisher, emit=emit))
    bus.register(cmd.SyncGit, GitSyncing(syncer=git, emit=emit))
    health = WorkerHealth()
    control = ControlHandlers(pools=runtime, stats=stats, health=health)
    for kind, handler in control.table().items():
        bus.register(kind, handler)
    return Composition(bus=bus, registry=registry, reconciler=reconciler, health=health,
                       dispatcher=dispatcher, breakers=breakers)


def _operator_handlers(
    bus: MessageBus,
    *,
    registry: FunctionRegistry,
    runtime: ContainerRuntime,
    slots: Slots,
    secrets: SecretStore,
    clock: Clock,
    tokens: TokenSource,
    dead_letters: DeadLetterSource,
) -> dict[type[Command], Handler]:
    """The handlers of what an operator runs by hand on the live worker, outside
    delivery: ``relay function invoke`` and ``relay dlq replay``."""
    invoker = FunctionInvoker(
        registry=registry, runtime=runtime, slots=slots, secrets=secrets, clock=clock,
        tokens=tokens, emit=bus.emit,
    )
    replayer = DeadLetterReplayer(
        dead_letters=dead_letters, registry=registry, runtime=runtime, slots=slots,
        secrets=secrets, emit=bus.emit,
    )
    return {cmd.InvokeFunction: invoker, cmd.ReplayDeadLetter: replayer}
