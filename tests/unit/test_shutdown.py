"""Graceful shutdown on fakes: intake stops at once, in-flight work finishes within the
grace or is released with no attempt charged, and a second signal cuts the grace short."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
from structlog.testing import capture_logs

from relay.application.buffer import MessageBuffer
from relay.application.consumer import ConsumerLoop, RecoveryLoop
from relay.application.shutdown import COMPLETE, GRACE_EXPIRED, INTERRUPTED, GracefulStop
from relay.domain import events as ev
from relay.domain.execution import InvocationRequest, InvocationResult
from relay.domain.invocation import invocation_field
from tests.unit.delivery_world import World, rule

pytestmark = pytest.mark.anyio

USERS = {"events": [rule("events.created.handler", {"table": ["users"]}, retries=2)]}
FIELD = invocation_field("users", "events.created.handler")
INSERT = b'{"table": "users"}'


async def wait_for(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not condition():  # noqa: ASYNC110 - polling the fakes' plain attributes
            await anyio.sleep(0.001)


class Handler:
    """A handler that runs until ``done`` is set (never, unless a test sets it)."""

    def __init__(self) -> None:
        self.started = 0
        self.done = anyio.Event()

    async def __call__(self, request: InvocationRequest) -> InvocationResult:
        self.started += 1
        await self.done.wait()
        return InvocationResult(ok=True)


def worker(world: World, grace_s: float) -> tuple[ConsumerLoop, RecoveryLoop, GracefulStop]:
    buffer = MessageBuffer(4)
    consumer = ConsumerLoop(world.stream, world.dispatch_batch, buffer, block_ms=1)
    recovery = RecoveryLoop(world.stream, world.dispatch_batch, buffer, interval_s=3600)
    return consumer, recovery, GracefulStop([consumer, recovery], buffer, grace_s=grace_s)


async def test_an_invocation_that_ends_within_the_grace_is_acknowledged() -> None:
    world = World()
    world.function("users", USERS)
    handler = Handler()
    world.runtime.script["users/events.created.handler"] = handler
    consumer, recovery, stop = worker(world, grace_s=30)
    first = world.stream.add(INSERT)
    outcome: list[str] = []
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(consumer.run)
            await tg.start(recovery.run)
            await wait_for(lambda: handler.started == 1)

            async def drain() -> None:
                outcome.append(await stop.drain())

            tg.start_soon(drain)
            await wait_for(lambda: consumer.intake.stopped)
            later = world.stream.add(INSERT)  # arrives after the signal: not read
            reads = world.stream.reads
            handler.done.set()
            await wait_for(lambda: bool(outcome))
            tg.cancel_scope.cancel()
    assert outcome == [COMPLETE]
    assert world.stream.acked == [first]
    assert world.stream.reads == reads  # no read after the stop
    assert later not in world.stream.pending
    assert handler.started == 1
    [started] = [e for e in logs if e["event"] == "shutdown_started"]
    assert (started["in_flight"], started["grace_s"]) == (1, 30)
    assert [e["event"] for e in logs if e["event"].startswith("shutdown_")] == [
        "shutdown_started",
        "shutdown_complete",
    ]


async def test_an_invocation_that_outlives_the_grace_is_released_uncharged() -> None:
    world = World()
    world.function("users", USERS)
    handler = Handler()
    world.runtime.script["users/events.created.handler"] = handler
    consumer, recovery, stop = worker(world, grace_s=0.05)
    message_id = world.stream.add(INSERT)
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(consumer.run)
            await tg.start(recovery.run)
            await wait_for(lambda: handler.started == 1)
            assert world.ledger.hashes[message_id][FIELD].startswith("running:")
            outcome = await stop.drain()
            tg.cancel_scope.cancel()  # what the daemon does once the grace is over
    assert outcome == GRACE_EXPIRED
    [expired] = [e for e in logs if e["event"] == "shutdown_grace_expired"]
    assert expired["in_flight"] == 1
    # Released: the marker is gone (nothing charged), the message stays pending.
    assert FIELD not in world.ledger.hashes[message_id]
    assert message_id in world.stream.pending
    assert world.stream.acked == []
    # The next delivery runs it as attempt 1 again, not 2 (each start is published
    # as it happens, the cancelled one too).
    handler.done.set()
    report = await world.redeliver(message_id)
    assert report.acknowledged
    assert [e.attempt for e in world.of(ev.InvocationStarted)] == [1, 1]
    assert [e.attempt for e in world.of(ev.InvocationSucceeded)] == [1]


async def test_a_second_signal_ends_the_grace_at_once() -> None:
    world = World()
    world.function("users", USERS)
    handler = Handler()
    world.runtime.script["users/events.created.handler"] = handler
    consumer, recovery, stop = worker(world, grace_s=3600)
    world.stream.add(INSERT)
    hurry = anyio.Event()
    outcome: list[str] = []
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(consumer.run)
            await tg.start(recovery.run)
            await wait_for(lambda: handler.started == 1)

            async def drain() -> None:
                outcome.append(await stop.drain(hurry))

            tg.start_soon(drain)
            await wait_for(lambda: consumer.intake.stopped)
            hurry.set()
            await wait_for(lambda: bool(outcome))
            tg.cancel_scope.cancel()
    assert outcome == [INTERRUPTED]
    assert any(e["event"] == "shutdown_interrupted" for e in logs)


async def test_an_idle_worker_stops_at_once_even_inside_a_backoff() -> None:
    world = World()
    world.stream.fail_reads = 1_000  # the consumer is backing off from an outage
    consumer, recovery, stop = worker(world, grace_s=3600)
    with anyio.fail_after(5):  # both loops return on their own: nothing is cancelled
        async with anyio.create_task_group() as tg:
            await tg.start(consumer.run)
            await tg.start(recovery.run)
            await wait_for(lambda: world.stream.reads >= 1)
            assert await stop.drain() == COMPLETE
    assert consumer.intake.stopped
    assert recovery.intake.stopped
