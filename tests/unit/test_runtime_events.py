"""When DockerContainerRuntime publishes its pool events, on fake attached containers.

The containers are real ``ExecutionContainer``s whose attach channel sits on a
transport that answers in the next loop turn, or only when told to (a slow
invocation), so the runtime's warm path runs without an engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import anyio
import pytest

from relay.adapters.docker.attach import AttachChannel
from relay.adapters.docker.containers import ContainerSpec, ExecutionContainer
from relay.adapters.docker.runtime import FLUSH_BATCH, DockerContainerRuntime
from relay.domain.events import ContainerAcquired
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


class Published:
    def __init__(self) -> None:
        self.batches: list[list[DomainEvent]] = []

    async def __call__(self, batch: Sequence[DomainEvent]) -> None:
        self.batches.append(list(batch))

    @property
    def events(self) -> list[DomainEvent]:
        return [event for batch in self.batches for event in batch]


def warm_runtime(
    containers: int, flush_after_s: float = 3600.0
) -> tuple[DockerContainerRuntime, list[DomainEvent], Published, list[AnsweringTransport]]:
    observed: list[DomainEvent] = []
    published = Published()
    runtime = DockerContainerRuntime(
        None,  # type: ignore[arg-type]  # no engine: every container is already warm
        hostname="h",
        output=lambda _: None,
        observer=observed.append,
        publish=published,
        flush_after_s=flush_after_s,
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
    return runtime, observed, published, transports


async def test_a_lone_invocation_publishes_its_events_before_it_returns() -> None:
    runtime, observed, published, _ = warm_runtime(1)
    for count in (1, 2, 3):
        assert (await runtime.invoke(REQUEST)).ok
        assert len(observed) == count
        assert published.events == observed


async def test_under_load_events_wait_for_a_full_batch_then_go_in_order() -> None:
    runtime, observed, published, transports = warm_runtime(2)
    slow = transports[-1]  # the most recently released container is leased first
    slow.hold = True
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.invoke, REQUEST)
        await anyio.wait_all_tasks_blocked()  # the slow one is in flight
        for _ in range(FLUSH_BATCH - 2):
            assert (await runtime.invoke(REQUEST)).ok
        assert published.batches == []  # one short of a batch, and no time bound here
        assert (await runtime.invoke(REQUEST)).ok
        assert published.events == observed
        assert len(observed) == FLUSH_BATCH
        slow.release()
    assert published.events == observed
    assert all(isinstance(event, ContainerAcquired) for event in observed)


async def test_under_load_the_time_bound_publishes_without_a_full_batch() -> None:
    runtime, observed, published, transports = warm_runtime(2, flush_after_s=0.0)
    transports[-1].hold = True
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.invoke, REQUEST)
        await anyio.wait_all_tasks_blocked()
        assert (await runtime.invoke(REQUEST)).ok
        assert published.events == observed  # published although the slow one still runs
        transports[-1].release()


async def test_close_publishes_what_is_left() -> None:
    runtime, observed, published, transports = warm_runtime(2)
    transports[-1].hold = True
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.invoke, REQUEST)
        await anyio.wait_all_tasks_blocked()
        assert (await runtime.invoke(REQUEST)).ok
        assert published.batches == []
        transports[-1].release()
    await runtime.aclose()  # idle containers are discarded (shutdown) and published too
    assert published.events == observed
    assert [type(event).__name__ for event in observed[-2:]] == ["ContainerDiscarded"] * 2
