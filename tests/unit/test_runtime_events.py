"""DockerContainerRuntime hands its pool events to the bus at once, on fake attached containers.

The containers are real ``ExecutionContainer``s whose attach channel sits on a
transport that answers in the next loop turn, or only when told to (a slow
invocation), so the runtime's warm path runs without an engine.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import anyio
import pytest

from relay.adapters.docker.attach import AttachChannel
from relay.adapters.docker.containers import ContainerSpec, ExecutionContainer
from relay.adapters.docker.direct import DirectSocket, DirectSockets
from relay.adapters.docker.runtime import DockerContainerRuntime
from relay.application.bus import MessageBus
from relay.domain.events import ContainerAcquired, ContainerDiscarded
from relay.domain.execution import InvocationRequest
from relay.domain.messages import DomainEvent
from tests.unit.attach_frames import answer, mux

pytestmark = pytest.mark.anyio

FN = "fn"
REQUEST = InvocationRequest(function=FN, handler="mod.handler", event=b"{}")


class AnsweringTransport:
    """Answers every request ok; with ``hold`` set, only once it is released."""

    def __init__(self) -> None:
        self.channel: AttachChannel | None = None
        self.hold = False
        self.held: list[bytes] = []

    def write(self, data: bytes) -> None:
        raw = mux(answer(json.loads(data)["id"]))
        if self.hold:
            self.held.append(raw)
        else:
            asyncio.get_running_loop().call_soon(self._deliver, raw)

    def release(self) -> None:
        self.hold = False
        for raw in self.held:
            self._deliver(raw)
        self.held.clear()

    def _deliver(self, raw: bytes) -> None:
        assert self.channel is not None
        self.channel.data_received(raw)

    def is_closing(self) -> bool:
        return False


class EngineContainer:
    """The engine's side of a container: only removal is asked of it here."""

    id = "c0ffee"

    def __init__(self) -> None:
        self.deleted = False

    async def delete(self, force: bool = False) -> None:
        self.deleted = force


class AttachStream:
    async def close(self) -> None:
        return None


def warm_runtime(
    containers: int,
) -> tuple[DockerContainerRuntime, list[DomainEvent], list[AnsweringTransport]]:
    """A runtime whose pool events go to a bus, as the worker wires it; returns
    what the bus's subscribers saw."""
    seen: list[DomainEvent] = []
    bus = MessageBus({})
    for kind in (ContainerAcquired, ContainerDiscarded):
        bus.subscribe(kind, seen.append)
    runtime = DockerContainerRuntime(
        None,  # type: ignore[arg-type]  # no engine: every container is already warm
        hostname="h",
        output=lambda _: None,
        observer=bus.emit,
    )
    runtime.activate(FN, "img", "python3.14", containers)
    pool = runtime._pools[FN]  # reach in: hand the pool its warm containers
    transports = []
    spec = ContainerSpec(function=FN, image="img", runtime="python3.14", hostname="h")
    for _ in range(containers):
        transport = AnsweringTransport()
        transport.channel = AttachChannel(transport)
        pool.idle.append(
            ExecutionContainer(
                spec=spec,
                container=EngineContainer(),
                stream=AttachStream(),
                channel=transport.channel,
            )
        )
        transports.append(transport)
    return runtime, seen, transports


async def test_a_lone_invocation_s_events_reach_the_bus_before_it_returns() -> None:
    runtime, seen, _ = warm_runtime(1)
    for count in (1, 2, 3):
        assert (await runtime.invoke(REQUEST)).ok
        assert len(seen) == count
    assert all(isinstance(event, ContainerAcquired) for event in seen)


async def test_events_reach_the_bus_at_once_while_another_invocation_runs() -> None:
    runtime, seen, transports = warm_runtime(2)
    slow = transports[-1]  # the most recently released container is leased first
    slow.hold = True
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.invoke, REQUEST)
        await anyio.wait_all_tasks_blocked()  # the slow one is in flight
        assert len(seen) == 1
        for count in (2, 3, 4):
            assert (await runtime.invoke(REQUEST)).ok
            assert len(seen) == count  # not held back until the slow one ends
        slow.release()
    assert all(isinstance(event, ContainerAcquired) for event in seen)


async def test_close_hands_over_the_discarded_idle_containers() -> None:
    runtime, seen, _ = warm_runtime(2)
    assert (await runtime.invoke(REQUEST)).ok
    await runtime.aclose()  # idle containers are discarded (shutdown)
    assert [type(event).__name__ for event in seen] == [
        "ContainerAcquired", "ContainerDiscarded", "ContainerDiscarded",
    ]


class SocketSide:
    """The container's end of Relay's socket, as the link sees it."""

    def __init__(self) -> None:
        self.closing = False

    def write(self, data: bytes) -> None:
        return None

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


async def test_a_container_whose_socket_was_flooded_while_idle_never_serves(
    tmp_path: Path,
) -> None:
    # its handler wrote into Relay's socket after answering: the next event
    # goes to another container, unharmed, and the reason is the protocol
    runtime, seen, _ = warm_runtime(2)
    flooded = runtime._pools[FN].idle[-1]  # the one leased first
    assert isinstance(flooded, ExecutionContainer)
    flooded.direct = DirectSocket(tmp_path / "c", DirectSockets(tmp_path))
    link = flooded.direct._accept()
    link.connection_made(SocketSide())
    link.data_received(b"x\n" * 40_000)
    assert (await runtime.invoke(REQUEST)).ok
    discarded = [e for e in seen if isinstance(e, ContainerDiscarded)]
    assert [e.reason for e in discarded] == ["protocol_error"]
    assert flooded.container.deleted
