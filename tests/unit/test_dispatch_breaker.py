"""The circuit breaker in DispatchMessage, on in-memory fakes: held invocations are
neither attempted nor charged, never dead-lettered, and complete once it closes."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs

from relay.application.breakers import UnknownBreakerTarget
from relay.domain import events as ev
from relay.domain.commands import ForceBreaker, GetBreaker
from relay.domain.execution import InvocationRequest, InvocationResult
from relay.domain.invocation import Running as RunningMarker
from relay.domain.invocation import format_marker, parse_marker
from tests.unit.delivery_world import World, rule

pytestmark = pytest.mark.anyio

FIELD = "pay/pay.charge"
BREAKER = {"failures": 2, "window": "1m", "cooldown": "30s", "max_cooldown": "2m"}
DOWN = InvocationResult(ok=False, error="connection refused", exit_code=1)


def world_with_breaker(**extra: Any) -> World:
    world = World()
    world.function(
        "pay",
        {
            "breaker": BREAKER,
            "events": [rule("pay.charge", {"kind": ["order"]}, retries=10)],
            **extra,
        },
    )
    world.function("audit", {"events": [rule("audit.log", {"kind": ["order"]})]})
    return world


def order(n: int) -> bytes:
    return b'{"kind": "order", "n": %d}' % n


def attempts(world: World, message_id: str) -> str | None:
    return world.ledger.hashes[message_id].get(FIELD)


async def open_it(world: World) -> list[str]:
    world.runtime.script[FIELD] = DOWN
    ids = [(await world.deliver(order(n))).message_id for n in (1, 2)]
    [opened] = world.of(ev.BreakerOpened)
    assert (opened.function, opened.cause, opened.failures) == ("pay", "failures", 2)
    return ids


async def test_an_open_breaker_holds_invocations_without_an_attempt_or_a_dlq_entry() -> None:
    world = world_with_breaker()
    await open_it(world)
    runs_before = len(world.runtime.requests)
    with capture_logs() as logs:
        held = await world.deliver(order(3))
    assert (held.acknowledged, held.outcome) == (False, "deferred")
    # the other function of the same message ran as usual
    assert world.handlers_run()[runs_before:] == ["audit/audit.log"]
    assert FIELD not in world.ledger.hashes[held.message_id]  # nothing charged
    [deferred] = world.of(ev.InvocationDeferred)
    assert (deferred.function, deferred.reason) == ("pay", "breaker_open")
    assert [e["reason"] for e in logs if e["event"] == "invocation_deferred"] == ["breaker_open"]
    # held again and again, for as long as it stays open: still nothing charged
    for _ in range(20):
        again = await world.redeliver(held.message_id)
        assert not again.acknowledged
    assert FIELD not in world.ledger.hashes[held.message_id]
    assert world.dlq.entries == []


async def test_after_the_cooldown_one_probe_closes_it_and_every_held_message_completes() -> None:
    world = world_with_breaker()
    first, second = await open_it(world)
    third = (await world.deliver(order(3))).message_id
    del world.runtime.script[FIELD]  # the downstream is back
    world.clock.advance(30)
    with capture_logs() as logs:
        probe = await world.redeliver(third)
    assert probe.acknowledged
    assert [type(e).__name__ for e in world.of(ev.BreakerHalfOpened)] == ["BreakerHalfOpened"]
    [closed] = world.of(ev.BreakerClosed)
    assert closed.cause == "probe_succeeded"
    assert [e["event"] for e in logs if e["event"].startswith("breaker_")] == [
        "breaker_half_open",
        "breaker_closed",
    ]
    for message_id in (first, second):
        world.expire_deadlines(message_id)
        assert (await world.redeliver(message_id)).acknowledged
    assert world.stream.pending == {}
    assert world.dlq.entries == []
    assert [s.attempt for s in world.of(ev.InvocationSucceeded) if s.function == "pay"] == [1, 2, 2]


async def test_while_the_probe_runs_every_other_invocation_is_held() -> None:
    world = world_with_breaker()
    first, _ = await open_it(world)
    world.clock.advance(30)
    seen: list[str] = []

    async def probe(request: InvocationRequest) -> InvocationResult:
        # the probe is in flight: a second message of the function is held meanwhile
        other = await world.deliver(order(9))
        seen.append(other.outcome)
        return InvocationResult(ok=True)

    world.runtime.script[FIELD] = probe
    world.expire_deadlines(first)
    assert (await world.redeliver(first)).acknowledged
    assert seen == ["deferred"]


async def test_a_failed_probe_reopens_it_with_the_cooldown_doubled() -> None:
    world = world_with_breaker()
    first, _ = await open_it(world)
    world.clock.advance(30)
    world.expire_deadlines(first)
    assert not (await world.redeliver(first)).acknowledged
    reopened = world.of(ev.BreakerOpened)[-1]
    assert (reopened.cause, reopened.cooldown_s) == ("probe_failed", 60.0)
    world.clock.advance(59)
    held = await world.deliver(order(4))
    assert held.outcome == "deferred"
    assert world.breakers.snapshot("pay").state == "open"


async def test_a_fenced_failure_does_not_count() -> None:
    world = World()
    world.function(
        "pay",
        {"breaker": {"failures": 1}, "events": [rule("pay.charge", {"kind": ["order"]})]},
    )

    def taken_over(request: InvocationRequest) -> InvocationResult:
        h = world.ledger.hashes[request.context]
        marker = parse_marker(h[FIELD])
        assert isinstance(marker, RunningMarker)
        h[FIELD] = format_marker(RunningMarker(marker.deadline_ms, marker.attempt + 1, "other"))
        return DOWN

    world.runtime.script[FIELD] = taken_over
    await world.deliver(order(1))
    assert world.of(ev.InvocationFenced)
    assert world.of(ev.BreakerOpened) == []
    assert world.breakers.snapshot("pay").state == "closed"


async def test_a_function_without_a_breaker_never_holds() -> None:
    world = World()
    world.function("pay", {"events": [rule("pay.charge", {"kind": ["order"]}, retries=0)]})
    world.runtime.script[FIELD] = DOWN
    for n in range(10):
        await world.deliver(order(n))
    assert world.of(ev.BreakerOpened) == []
    assert len(world.dlq.entries) == 10


async def test_forced_open_holds_until_forced_closed_and_unknown_functions_are_refused() -> None:
    world = world_with_breaker()
    snapshot = await world.bus.send(ForceBreaker(function="pay", state="open"))
    assert (snapshot.state, snapshot.forced) == ("open", True)
    held = await world.deliver(order(1))
    assert held.outcome == "deferred"
    world.clock.advance(3600)  # no probe while forced
    assert not (await world.redeliver(held.message_id)).acknowledged
    await world.bus.send(ForceBreaker(function="pay", state="closed"))
    assert (await world.redeliver(held.message_id)).acknowledged
    assert (await world.bus.send(GetBreaker(function="pay"))).state == "closed"
    with pytest.raises(UnknownBreakerTarget, match='function "nope" not found on the worker'):
        await world.bus.send(GetBreaker(function="nope"))
    with pytest.raises(UnknownBreakerTarget, match='must be "open" or "closed"'):
        await world.bus.send(ForceBreaker(function="pay", state="half"))


async def test_invocations_queued_for_a_slot_when_it_opens_are_held() -> None:
    world = World(slot_wait_s=30)
    world.function(
        "pay",
        {
            "concurrency": 1,
            "breaker": {"failures": 1},
            "events": [rule("pay.charge", {"kind": ["order"]}, retries=10)],
        },
    )
    gate = anyio.Event()

    async def down_after_the_gate(request: InvocationRequest) -> InvocationResult:
        await gate.wait()
        return DOWN

    world.runtime.script[FIELD] = down_after_the_gate
    reports = []

    async def deliver(n: int) -> None:
        reports.append(await world.deliver(order(n)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(deliver, 1)
        tg.start_soon(deliver, 2)
        while world.slots.waits_total < 1:  # the second one waits for the only slot
            await anyio.lowlevel.checkpoint()
        gate.set()
    assert len(world.runtime.requests) == 1  # the queued one never ran
    assert sorted(r.outcome for r in reports) == ["deferred", "retrying"]
    assert [d.reason for d in world.of(ev.InvocationDeferred)] == ["breaker_open"]


async def test_an_invocation_that_found_no_slot_never_becomes_the_probe() -> None:
    world = World(slot_wait_s=0.01)
    world.function(
        "pay",
        {
            "concurrency": 1,
            "breaker": {"failures": 1, "cooldown": "30s"},
            "events": [rule("pay.charge", {"kind": ["order"]}, retries=10)],
        },
    )
    world.runtime.script[FIELD] = DOWN
    await world.deliver(order(1))  # opens it
    world.clock.advance(30)
    del world.runtime.script[FIELD]
    held = anyio.Event()
    release = anyio.Event()

    async def hold_the_slot() -> None:
        async with world.slots.acquire("pay"):
            held.set()
            await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold_the_slot)
        await held.wait()
        starved = await world.deliver(order(2))
        release.set()
    assert starved.outcome == "deferred"
    assert [d.reason for d in world.of(ev.InvocationDeferred)] == ["slot_unavailable"]
    # asked only once a slot is held: the starved one was never the probe
    assert world.breakers.snapshot("pay").state == "open"
    assert world.of(ev.BreakerHalfOpened) == []
    probe = await world.deliver(order(3))
    assert probe.acknowledged
    assert world.breakers.snapshot("pay").state == "closed"


async def test_timeouts_count_as_failures() -> None:
    world = world_with_breaker()
    # what the Docker runtime answers when a handler outlives its timeout
    world.runtime.script[FIELD] = InvocationResult(
        ok=False, error='function "pay" handler "pay.charge": timed out after 6s'
    )
    for n in (1, 2):
        await world.deliver(order(n))
    [opened] = world.of(ev.BreakerOpened)
    assert opened.cause == "failures"
    assert (await world.deliver(order(3))).outcome == "deferred"
