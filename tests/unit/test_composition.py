"""The real composition root, wired to in-memory fakes.

Every command has exactly one handler; a message travels from the stream to its
handler and is acked; every named state change happens under its command (the
bus's audit sees the command each fact was emitted under); and facts leave a
handler one way only, the bus's sink.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from relay.application.bus import MessageBus, Outcome
from relay.application.scheduler import Scheduler
from relay.application.services import ServiceConverger
from relay.domain import commands
from relay.domain import events as ev
from relay.domain.git import GitSyncResult
from relay.domain.messages import Command, DomainEvent
from relay.domain.services import RoutingSettings
from tests.fakes import (
    FakeClock,
    InMemorySecretStore,
    InMemoryServiceContainers,
    InMemoryServiceImages,
)
from tests.fakes_compose import FakeWorker

pytestmark = pytest.mark.anyio

SRC = Path(__file__).resolve().parents[2] / "src" / "relay"

# Each state change issue 31 names, by the fact that records it, and the commands
# it may happen under. "Function prepared/removed" is ReconcileFunction (or the
# whole-directory pass): the handler decides which by looking at the directory.
# A breaker trips while DispatchBatch (DispatchMessage) records results; it is
# forced by ForceBreaker.
STATE_CHANGES: dict[type[DomainEvent], frozenset[type[Command]]] = {
    ev.FunctionPrepared: frozenset({commands.ReconcileFunction, commands.ReconcileAll}),
    ev.FunctionRemoved: frozenset({commands.ReconcileFunction, commands.ReconcileAll}),
    ev.ServicesConverged: frozenset({commands.ConvergeServices}),
    ev.OccurrencePublished: frozenset({commands.PublishOccurrence}),
    ev.GitSyncFinished: frozenset({commands.SyncGit}),
    ev.BreakerOpened: frozenset(
        {commands.ForceBreaker, commands.DispatchBatch, commands.DispatchMessage}
    ),
    ev.BreakerClosed: frozenset(
        {commands.ForceBreaker, commands.DispatchBatch, commands.DispatchMessage}
    ),
}

TEMPLATE = """\
runtime: python3.14
events:
  - handler: main.handler
    pattern:
      kind: [hello]
schedules:
  - handler: main.tick
    cron: "* * * * * *"
services:
  - entrypoint: service.py
    port: 3000
"""


def all_commands() -> set[type[Command]]:
    return {
        value
        for value in vars(commands).values()
        if isinstance(value, type) and issubclass(value, Command) and value is not Command
    }


def violations(audit: list[tuple[DomainEvent, Command | None]]) -> list[str]:
    """Every state change emitted outside the commands allowed for it."""
    found = []
    for event, command in audit:
        allowed = STATE_CHANGES.get(type(event))
        if allowed is not None and type(command) not in allowed:
            sent = "no command" if command is None else type(command).__name__
            found.append(f"{type(event).__name__} under {sent}")
    return found


class FixedSync:
    """A ``GitSyncer`` that always brings the same commit."""

    functions_dir = Path("/functions")

    async def sync_functions(self) -> GitSyncResult:
        return GitSyncResult(repository="git@x:o/r.git", ref="main", commit="c" * 40,
                             directory=str(self.functions_dir))


def function_dir(root: Path, name: str = "greeter") -> Path:
    fn = root / name
    fn.mkdir()
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "main.py").write_text("def handler(event):\n    return None\n")
    (fn / "service.py").write_text("# a server\n")
    return fn


def audited_worker(root: Path, audit: list[tuple[DomainEvent, Command | None]]) -> FakeWorker:
    clock, secrets = FakeClock(), InMemorySecretStore()
    services = ServiceConverger(
        images=InMemoryServiceImages(), containers=InMemoryServiceContainers(),
        secrets=secrets, routing=RoutingSettings(), hostname="w1",
        env_key=b"k" * 32, clock=clock,
    )
    return FakeWorker(root, clock=clock, secrets=secrets, services=services,
                      audit=lambda e, c: audit.append((e, c)), git=FixedSync())


def test_every_command_has_exactly_one_handler(tmp_path: Path) -> None:
    assert FakeWorker(tmp_path).bus.handled_commands == all_commands()


async def test_a_second_handler_for_a_command_is_a_wiring_error(tmp_path: Path) -> None:
    bus = FakeWorker(tmp_path).bus
    with pytest.raises(ValueError, match="already has a handler"):
        bus.register(commands.ResetStats, bus_handler_stub)


async def bus_handler_stub(_command: Command) -> Outcome[None]:
    raise AssertionError("never called")


async def test_a_message_reaches_its_handler_through_the_composed_bus(tmp_path: Path) -> None:
    function_dir(tmp_path)
    world = FakeWorker(tmp_path)
    bus = world.bus
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


async def test_every_named_state_change_happens_under_its_command(tmp_path: Path) -> None:
    audit: list[tuple[DomainEvent, Command | None]] = []
    fn = function_dir(tmp_path)
    world = audited_worker(tmp_path, audit)
    bus = world.bus
    await bus.send(commands.ReconcileAll())  # prepared, services converged
    scheduler = Scheduler(registry=world.registry, clock=world.clock, send=bus.send)
    await scheduler.start()
    world.clock.advance(2)
    await scheduler.tick()  # occurrences published
    await bus.send(commands.SyncGit())  # git synced
    await bus.send(commands.ForceBreaker(function="greeter", state="open"))
    await bus.send(commands.ForceBreaker(function="greeter", state="closed"))
    for path in fn.iterdir():
        path.unlink()
    fn.rmdir()
    await bus.send(commands.ReconcileFunction(name="greeter"))  # removed

    assert {type(e) for e, _ in audit} >= set(STATE_CHANGES)  # the scenario covers each
    assert violations(audit) == []


async def test_a_state_change_without_its_command_is_caught(tmp_path: Path) -> None:
    audit: list[tuple[DomainEvent, Command | None]] = []
    bus = FakeWorker(tmp_path, audit=lambda e, c: audit.append((e, c))).bus
    bus.emit(ev.FunctionRemoved(name="ghost", at=0.0))  # as a loop bypassing the bus would
    await bus.send(commands.ResetStats())
    bus.emit(ev.GitSyncFinished(ok=True, commit="c"))  # after the command ended
    assert violations(audit) == [
        "FunctionRemoved under no command", "GitSyncFinished under no command"
    ]
    audit.clear()

    async def wrong(_cmd: commands.GetHealth) -> Outcome[None]:
        bus.emit(ev.GitSyncFinished(ok=True, commit="c"))
        return Outcome(None)

    other = MessageBus({commands.GetHealth: wrong}, audit=lambda e, c: audit.append((e, c)))
    await other.send(commands.GetHealth())
    assert violations(audit) == ["GitSyncFinished under GetHealth"]


# --- events one way ------------------------------------------------------------------
def test_a_handler_returns_only_its_result_and_the_bus_has_one_sink() -> None:
    assert [f.name for f in dataclasses.fields(Outcome)] == ["result"]
    for old_way in ("publish", "notify"):
        assert not hasattr(MessageBus, old_way), f"MessageBus.{old_way} is back"


def _other_ways_out(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "Outcome" and (
            len(node.args) + len(node.keywords) != 1
        ):
            found.append(f"{path.name}:{node.lineno}: Outcome with events")
        if isinstance(func, ast.Attribute) and func.attr in {"publish", "notify"}:
            receiver = ast.unparse(func.value)
            if receiver.split(".")[-1].lstrip("_") == "bus":
                found.append(f"{path.name}:{node.lineno}: {receiver}.{func.attr}(...)")
    return found


def test_no_code_publishes_an_event_any_other_way_than_the_sink() -> None:
    found = [hit for path in sorted(SRC.rglob("*.py")) for hit in _other_ways_out(path)]
    assert found == []


def test_the_scan_would_see_another_way_out(tmp_path: Path) -> None:
    sample = tmp_path / "handler.py"
    sample.write_text(
        "async def handle(self, cmd):\n"
        "    await self._bus.publish([Fact()])\n"
        "    bus.notify(Fact())\n"
        "    return Outcome(1, [Fact()])\n"
    )
    assert len(_other_ways_out(sample)) == 3


async def test_an_asynchronous_subscriber_sees_what_a_command_emitted_before_it_returns(
    tmp_path: Path,
) -> None:
    function_dir(tmp_path)
    world = FakeWorker(tmp_path)
    seen: list[str] = []

    async def state_view(event: ev.FunctionPrepared) -> None:
        seen.append(event.name)

    world.bus.subscribe(ev.FunctionPrepared, state_view)
    await world.bus.send(commands.ReconcileAll())
    assert seen == ["greeter"]


async def test_a_removed_function_forgets_its_breaker_under_its_reconcile(tmp_path: Path) -> None:
    root = tmp_path / "functions"
    root.mkdir()
    fn = function_dir(root)
    audit: list[tuple[DomainEvent, Command | None]] = []
    world = FakeWorker(root, audit=lambda e, c: audit.append((e, c)))
    bus = world.bus
    await bus.send(commands.ReconcileAll())
    await bus.send(commands.ForceBreaker(function="greeter", state="open"))
    fn.rename(tmp_path / "aside")
    await bus.send(commands.ReconcileFunction(name="greeter"))  # removed
    (tmp_path / "aside").rename(fn)
    await bus.send(commands.ReconcileFunction(name="greeter"))  # added again
    again = await bus.send(commands.GetBreaker(function="greeter"))
    assert (again.state, again.forced) == ("closed", False)
    assert violations(audit) == []
