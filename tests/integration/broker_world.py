"""Relay's real delivery path on the embedded broker: the SQLite stream, ledger
and DLQ on a real file, the real dispatcher, consumer and recovery loops; only
the container runtime is the in-memory fake (``tests/fakes.py``).

Run as a module (``python -m tests.integration.broker_world FILE JOURNAL``) it is
a worker process for the crash-and-restart test: its handler appends
``start``/``end`` lines (message id, pid) to ``JOURNAL``, so the test
can tell which runs a SIGKILL cut short and whether two ever overlapped.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio

from relay.adapters.sqlite.broker.ledger import SqliteInvocationLedger
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.schedules import (
    SqliteOccurrenceHistory,
    SqliteOccurrencePublisher,
)
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.adapters.system import RandomTokenSource, SystemClock
from relay.application.breakers import BreakerBoard
from relay.application.buffer import MessageBuffer
from relay.application.bus import MessageBus
from relay.application.concurrency import Slots
from relay.application.consumer import ConsumerLoop, RecoveryLoop
from relay.application.dispatch import MessageDispatcher
from relay.application.ports import Clock
from relay.application.registry import ActiveFunction, FunctionRegistry
from relay.domain.commands import DispatchBatch, DispatchMessage
from relay.domain.execution import InvocationRequest, InvocationResult
from relay.domain.template import parse_template
from tests.fakes import InMemoryContainerRuntime, InMemorySecretStore

FUNCTION = "fn"
HANDLER = "h.run"
FIELD = f"{FUNCTION}/{HANDLER}"


class BrokerWorld:
    """One worker's delivery path on the broker file at ``path``."""

    def __init__(
        self,
        path: Path,
        *,
        clock: Clock | None = None,
        consumer: str = "worker-1",
        template: dict[str, Any] | None = None,
        max_event_bytes: int = 1024,
    ) -> None:
        self.clock = clock or SystemClock()
        self.store = BrokerStore(path, self.clock)
        self.stream = SqliteEventStream(self.store, stream="events", group="relay",
                                        consumer=consumer)
        self.ledger = SqliteInvocationLedger(self.store)
        self.publisher = SqliteEventPublisher(self.store, "events")
        self.occurrences = SqliteOccurrencePublisher(self.store, "events")
        self.registry = FunctionRegistry()
        self.registry.mark_complete()
        self.runtime = InMemoryContainerRuntime()
        self.slots = Slots(16, wait_s=0.05)
        self.bus = MessageBus({})
        self.breakers = BreakerBoard(
            clock=self.clock, registry=self.registry, emit=self.bus.emit
        )
        self.dispatcher = MessageDispatcher(
            stream=self.stream, ledger=self.ledger, registry=self.registry,
            runtime=self.runtime, slots=self.slots, secrets=InMemorySecretStore(),
            clock=self.clock, tokens=RandomTokenSource(), max_event_bytes=max_event_bytes,
            slot_wait_s=0.05, notify=self.bus.emit, lease_grace_ms=500,
            history=SqliteOccurrenceHistory(self.store, "events"),  # as relay start wires it
            breakers=self.breakers,
        )
        self.bus.register(DispatchMessage, self.dispatcher)
        self.bus.register(DispatchBatch, self.dispatcher.handle_batch)
        spec = template or {"events": [{"handler": HANDLER, "pattern": {"kind": ["job"]},
                                        "timeout": "1s", "retries": 2}], "concurrency": 16}
        parsed = parse_template({"runtime": "python3.14", **spec})
        self.registry.put(ActiveFunction(
            name=FUNCTION, directory=f"/functions/{FUNCTION}", template=parsed,
            runtime="python3.14", image="img", fingerprint=None, prepared_at=None,
        ))
        self.runtime.activate(FUNCTION, "img", "python3.14", parsed.concurrency)
        self.slots.resize(FUNCTION, parsed.concurrency)

    async def dispatch(self, message: Any) -> None:
        await self.bus.send(DispatchMessage(message=message))

    async def dispatch_batch(self, messages: Any, done: Any) -> None:
        await self.bus.send(DispatchBatch(messages=tuple(messages), done=done))

    async def run_loops(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """The consumer and recovery loops, as ``relay start`` runs them (fast recovery)."""
        buffer = MessageBuffer(16)
        consumer = ConsumerLoop(self.stream, self.dispatch_batch, buffer)
        recovery = RecoveryLoop(self.stream, self.dispatch_batch, buffer, interval_s=0.2,
                                min_idle_ms=300)
        async with anyio.create_task_group() as tg:
            await tg.start(consumer.run)
            await tg.start(recovery.run)
            task_status.started()

    def close(self) -> None:
        self.store.close()


def _journaled(journal: int) -> Any:
    pid = os.getpid()

    async def handler(request: InvocationRequest) -> InvocationResult:
        os.write(journal, f"start {request.context} {pid}\n".encode())
        await anyio.sleep(0.002)  # a handler that takes a little time
        os.write(journal, f"end {request.context} {pid}\n".encode())
        return InvocationResult(ok=True)

    return handler


async def _serve(path: Path, journal_path: Path) -> None:
    world = BrokerWorld(path)
    journal = os.open(journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    world.runtime.script[FIELD] = _journaled(journal)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(world.run_loops)
            os.write(journal, f"ready - {os.getpid()}\n".encode())
    finally:
        os.close(journal)
        world.close()


if __name__ == "__main__":
    anyio.run(_serve, Path(sys.argv[1]), Path(sys.argv[2]))
