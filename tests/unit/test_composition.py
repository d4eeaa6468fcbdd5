"""The real composition root, wired to in-memory fakes: every command has exactly
one handler, and a message travels from the stream to its handler and is acked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relay.adapters.fs.discovery import FsFunctionSource
from relay.application.bus import MessageBus, Outcome
from relay.application.concurrency import Slots
from relay.application.registry import FunctionRegistry
from relay.bootstrap import Composition, compose
from relay.domain import commands
from relay.domain.dead_letters import StoredDeadLetter
from relay.domain.messages import Command
from tests.fakes import (
    FakeClock,
    InMemoryContainerRuntime,
    InMemoryDeadLetterQueue,
    InMemoryEventStream,
    InMemoryImageBuilder,
    InMemoryLedger,
    InMemorySecretStore,
    SequentialTokens,
)

pytestmark = pytest.mark.anyio


class NoDeadLetters:
    async def get(self, entry_id: str) -> StoredDeadLetter:
        raise LookupError(entry_id)

    async def discard(self, entry_id: str) -> bool:
        return False


class CountingStats:
    def __init__(self) -> None:
        self.resets = 0

    async def reset(self) -> None:
        self.resets += 1


def all_commands() -> set[type[Command]]:
    return {
        value
        for value in vars(commands).values()
        if isinstance(value, type) and issubclass(value, Command) and value is not Command
    }


class World:
    def __init__(self, functions: Path) -> None:
        self.clock = FakeClock()
        self.stream = InMemoryEventStream(self.clock)
        self.dlq = InMemoryDeadLetterQueue()
        self.runtime = InMemoryContainerRuntime()
        self.stats = CountingStats()
        self.composition: Composition = compose(
            bus=MessageBus({}),
            registry=FunctionRegistry(),
            source=FsFunctionSource(functions),
            builder=InMemoryImageBuilder(),
            runtime=self.runtime,
            slots=Slots(max_concurrency=8),
            secrets=InMemorySecretStore(),
            clock=self.clock,
            tokens=SequentialTokens(),
            stream=self.stream,
            ledger=InMemoryLedger(self.stream, self.dlq, self.clock),
            dead_letters=NoDeadLetters(),
            stats=self.stats,
            max_event_bytes=256 * 1024,
        )


def test_every_command_has_exactly_one_handler(tmp_path: Path) -> None:
    bus = World(tmp_path).composition.bus
    assert bus.handled_commands == all_commands()


async def test_a_second_handler_for_a_command_is_a_wiring_error(tmp_path: Path) -> None:
    bus = World(tmp_path).composition.bus
    with pytest.raises(ValueError, match="already has a handler"):
        bus.register(commands.ResetStats, bus_handler_stub)


async def bus_handler_stub(_command: Command) -> Outcome[None]:
    raise AssertionError("never called")


async def test_a_message_reaches_its_handler_through_the_composed_bus(tmp_path: Path) -> None:
    fn = tmp_path / "greeter"
    fn.mkdir()
    (fn / "template.yaml").write_text(
        "runtime: python3.14\nevents:\n  - handler: main.handler\n"
        "    pattern:\n      kind: [hello]\n"
    )
    (fn / "main.py").write_text("def handler(event):\n    return None\n")
    world = World(tmp_path)
    bus = world.composition.bus
    await bus.send(commands.ReconcileAll())
    message_id = world.stream.add(json.dumps({"kind": "hello"}).encode())
    [message] = await world.stream.read(10, 0)
    await bus.send(commands.DispatchMessage(message=message))

    requests = world.runtime.requests
    assert [(r.function, r.handler) for r in requests] == [("greeter", "main.handler")]
    assert json.loads(requests[0].event) == {"kind": "hello"}
    assert world.stream.acked == [message_id]
    health = await bus.send(commands.GetHealth())
    assert not health.ready  # the worker marks itself started only after its loops run
    await bus.send(commands.ResetStats())
    assert world.stats.resets == 1
