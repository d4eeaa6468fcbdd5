"""DispatchBatch on in-memory fakes: a read batch claimed in one ledger call,
attempted concurrently, settled in groups, with every member's own outcome."""

from __future__ import annotations

import anyio
import pytest

from relay.domain import events as ev
from relay.domain.execution import InvocationRequest, InvocationResult
from tests.unit.delivery_world import World, rule

pytestmark = pytest.mark.anyio

USERS = {"events": [rule("events.created.handler", {"table": ["users"]})]}
FIELD = "users/events.created.handler"


def insert(n: int) -> bytes:
    return b'{"table": "users", "id": %d}' % n


async def test_a_read_batch_is_claimed_in_one_call_and_settled_in_one_group() -> None:
    world = World()
    world.function("users", USERS)
    for n in range(5):
        world.stream.add(insert(n))
    messages = await world.stream.read(5, 0)
    reports = await world.dispatch_batch(messages)
    assert [(r.acknowledged, r.outcome) for r in reports] == [(True, "completed")] * 5
    assert world.ledger.batches == [("begin_many", 5), ("finish_many", 5)]
    assert world.stream.pending == {}
    assert len(world.runtime.requests) == 5


async def test_a_batch_of_mixed_members_reports_each_ones_own_outcome() -> None:
    world = World()
    world.function("users", USERS)
    world.runtime.script[FIELD] = lambda r: InvocationResult(ok=b'"id": 2' not in r.event,
                                                             error="boom")
    payloads = [b"not json", b'{"table": "orders"}', insert(1), insert(2)]
    for payload in payloads:
        world.stream.add(payload)
    messages = await world.stream.read(4, 0)
    reports = await world.dispatch_batch(messages)
    assert [r.message_id for r in reports] == [m.id for m in messages]
    assert [r.outcome for r in reports] == ["malformed", "unmatched", "completed", "retrying"]
    # the malformed member never reaches begin_many; the unmatched one settles there
    assert world.ledger.batches == [("begin_many", 3), ("finish_many", 2)]
    assert set(world.stream.pending) == {messages[3].id}


async def test_a_slow_invocation_never_holds_back_another_messages_ack() -> None:
    world = World()
    world.function("users", {**USERS, "concurrency": 4})
    gate = anyio.Event()

    async def handler(request: InvocationRequest) -> InvocationResult:
        if b'"id": 0' in request.event:
            await gate.wait()
        return InvocationResult(ok=True)

    world.runtime.script[FIELD] = handler
    for n in range(4):
        world.stream.add(insert(n))
    messages = await world.stream.read(4, 0)
    ended: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(world.dispatch_batch, messages, ended.append)
        with anyio.fail_after(5):
            while len(ended) < 3:  # noqa: ASYNC110 - the fake's plain list
                await anyio.sleep(0.001)
        # the three fast ones are acknowledged (and their places free) while the
        # slow one still runs
        assert set(ended) == {m.id for m in messages[1:]}
        assert set(world.stream.pending) == {messages[0].id}
        gate.set()
    assert ended[-1] == messages[0].id
    assert world.stream.pending == {}


async def test_a_claim_failure_keeps_the_whole_batch_pending_and_runs_nothing() -> None:
    world = World()
    world.function("users", USERS)
    for n in range(3):
        world.stream.add(insert(n))
    messages = await world.stream.read(3, 0)
    world.ledger.fail_next.add("begin")
    reports = await world.dispatch_batch(messages)
    assert [r.outcome for r in reports] == ["claim_failed"] * 3
    assert world.runtime.requests == []
    assert len(world.stream.pending) == 3
    assert len(world.of(ev.LedgerUnavailable)) == 3


async def test_a_finish_failure_keeps_the_group_pending_for_the_next_delivery() -> None:
    world = World()
    world.function("users", USERS)
    for n in range(3):
        world.stream.add(insert(n))
    messages = await world.stream.read(3, 0)
    world.ledger.fail_next.add("finish")
    reports = await world.dispatch_batch(messages)
    assert [r.outcome for r in reports] == ["finish_failed"] * 3
    assert len(world.stream.pending) == 3


async def test_a_lost_delivery_is_dropped_quietly_and_its_place_freed() -> None:
    """The embedded broker's case: another consumer holds the delivery now."""
    world = World()
    world.function("users", USERS)
    for n in range(2):
        world.stream.add(insert(n))
    messages = await world.stream.read(2, 0)
    world.ledger.lost.add(messages[0].id)
    lost_events: list[ev.DeliveryLost] = []
    world.bus.subscribe(ev.DeliveryLost, lost_events.append)
    ended: list[str] = []
    reports = await world.dispatch_batch(messages, ended.append)
    assert [r.outcome for r in reports] == ["lost", "completed"]
    assert sorted(ended) == sorted(m.id for m in messages)
    assert [e.message_id for e in lost_events] == [messages[0].id]
    assert len(world.runtime.requests) == 1  # the lost one never ran
    lost_id = messages[0].id
    assert not any(  # nothing settled, kept or dead-lettered for it
        getattr(e, "message_id", None) == lost_id for e in world.events
    )


async def test_a_cancelled_batch_records_what_ran_and_releases_what_did_not() -> None:
    """Shutdown mid-batch: the result that ran is recorded (shielded), the claims
    that never ran are released uncharged, and nothing is acknowledged by mistake."""
    world = World()
    world.function("users", {**USERS, "concurrency": 4})
    started = anyio.Event()

    async def handler(request: InvocationRequest) -> InvocationResult:
        if b'"id": 0' in request.event:
            started.set()
            await anyio.sleep_forever()
        return InvocationResult(ok=True)

    world.runtime.script[FIELD] = handler
    for n in range(2):
        world.stream.add(insert(n))
    messages = await world.stream.read(2, 0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(world.dispatch_batch, messages)
        await started.wait()
        with anyio.fail_after(5):
            while messages[1].id in world.stream.pending:  # noqa: ASYNC110 - the fake's dict
                await anyio.sleep(0.001)
        tg.cancel_scope.cancel()
    assert set(world.stream.pending) == {messages[0].id}  # the fast one was acked
    # the one cancelled mid-run went back to its marker: no attempt charged
    assert FIELD not in world.ledger.hashes[messages[0].id]
    assert [e.reason for e in world.of(ev.InvocationDeferred)] == ["shutdown"]


async def test_a_cancelled_batch_settles_a_member_running_in_its_own_task() -> None:
    """As above with the slow member not the batch's first (it runs in a task of
    its own, which the batch's cancellation reaches too)."""
    world = World()
    world.function("users", {**USERS, "concurrency": 4})
    started = anyio.Event()

    async def handler(request: InvocationRequest) -> InvocationResult:
        if b'"id": 2' in request.event:
            started.set()
            await anyio.sleep_forever()
        return InvocationResult(ok=True)

    world.runtime.script[FIELD] = handler
    for n in range(3):
        world.stream.add(insert(n))
    messages = await world.stream.read(3, 0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(world.dispatch_batch, messages)
        await started.wait()
        with anyio.fail_after(5):
            while len(world.stream.pending) > 1:  # noqa: ASYNC110 - the fake's dict
                await anyio.sleep(0.001)
        tg.cancel_scope.cancel()
    assert set(world.stream.pending) == {messages[2].id}
    assert FIELD not in world.ledger.hashes[messages[2].id]  # released: no attempt charged
    assert [e.reason for e in world.of(ev.InvocationDeferred)] == ["shutdown"]
