"""Two workers, flaky handlers, recovery: nothing lost, nothing run concurrently,
one DLQ entry per exhausted invocation, every event classified exactly once.

A small in-process soak on real Redis (the Docker soak with SIGKILLs is bench/soak.py).
Backoff deadlines are rewritten in the ledger so retries happen in seconds.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator

import anyio
import pytest
import redis.asyncio

from relay.adapters.redis.keys import invocation_key
from relay.application.buffer import MessageBuffer
from relay.application.consumer import ConsumerLoop, RecoveryLoop
from relay.domain import events as ev
from relay.domain.execution import InvocationRequest, InvocationResult
from tests.integration.delivery_support import RedisWorld, bytes_client, text
from tests.unit.delivery_world import rule

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

_REWRITE = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
"""
EVENTS = 300
RETRIES = 2


@pytest.fixture
async def bytes_redis(request: pytest.FixtureRequest) -> AsyncIterator[redis.asyncio.Redis]:
    async with bytes_client(request) as client:
        yield client


class Handlers:
    """Shared by both workers: fails 30% of attempts; records every execution."""

    def __init__(self) -> None:
        self.rng = random.Random(7)
        self.running: set[tuple[str, str]] = set()
        self.overlaps = 0
        self.executions: Counter[tuple[str, str]] = Counter()
        self.failures: Counter[tuple[str, str]] = Counter()

    async def __call__(self, request: InvocationRequest) -> InvocationResult:
        key = (request.context, f"{request.function}/{request.handler}")
        if key in self.running:
            self.overlaps += 1
        self.running.add(key)
        self.executions[key] += 1
        try:
            await anyio.sleep(self.rng.random() * 0.002)
            if self.rng.random() < 0.3:
                self.failures[key] += 1
                return InvocationResult(ok=False, error="flaky")
            return InvocationResult(ok=True)
        finally:
            self.running.discard(key)


async def expire_backoffs(world: RedisWorld) -> None:
    """Rewrite every next_attempt_at deadline into the past, as the tests of the
    original do, so a retry is due at the next recovery tick."""
    rows = await world.client.xpending_range(
        world.stream_name, "relay", min="-", max="+", count=10_000
    )
    for row in rows:
        message_id = text(row["message_id"])
        key = invocation_key(world.stream_name, "relay", message_id)
        for field, value in (await world.ledger_hash(message_id)).items():
            if value.startswith("next_attempt_at:"):
                attempt = value.split("#", 1)[1]
                # Compare-and-set: a worker may have claimed it since it was read.
                await world.client.eval(
                    _REWRITE, 1, key, field, value, f"next_attempt_at:1000#{attempt}"
                )


async def test_two_workers_lose_nothing_and_never_overlap(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    handlers = Handlers()
    template = {
        "events": [
            rule("events.a.handler", {"kind": ["order"]}, retries=RETRIES),
            rule("events.b.handler", {"kind": ["order"]}, retries=RETRIES),
        ]
    }
    workers = [RedisWorld(bytes_redis, unique, consumer=name) for name in ("w1", "w2")]
    for world in workers:
        world.function("orders", template)
        world.runtime.script["orders/events.a.handler"] = handlers
        world.runtime.script["orders/events.b.handler"] = handlers
    await workers[0].stream.ensure_group()
    for i in range(EVENTS):
        await workers[0].add(b'{"kind": "order", "n": %d}' % i)

    def acked() -> int:
        return sum(isinstance(e, ev.MessageAcknowledged) for w in workers for e in w.events)

    async with anyio.create_task_group() as tg:
        for world in workers:
            buffer = MessageBuffer(8)
            consumer = ConsumerLoop(world.stream, world.dispatch_batch, buffer, block_ms=20)
            await tg.start(consumer.run)
            recovery = RecoveryLoop(
                world.stream, world.dispatch_batch, buffer, interval_s=0.05, min_idle_ms=50
            )
            await tg.start(recovery.run)
        with anyio.fail_after(90):
            while acked() < EVENTS:
                await expire_backoffs(workers[0])
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()

    assert await workers[0].pending() == set()
    assert handlers.overlaps == 0
    assert max(handlers.executions.values()) <= 1 + RETRIES
    exhausted = {k for k, n in handlers.failures.items() if n == 1 + RETRIES}
    entries = await workers[0].dlq()
    assert sorted((e["original_id"], f"{e['function']}/{e['handler']}") for e in entries) == sorted(
        exhausted
    )
    assert all(e["handler_attempts"] == str(1 + RETRIES) for e in entries)
    classified = [e for w in workers for e in w.events if isinstance(e, ev.EventClassified)]
    assert len(classified) == EVENTS
    assert len({c.message_id for c in classified}) == EVENTS
    # Every invocation either succeeded once or was exhausted.
    assert len(handlers.executions) == 2 * EVENTS
    succeeded = {
        (e.message_id, f"{e.function}/{e.handler}")
        for w in workers
        for e in w.events
        if isinstance(e, ev.InvocationSucceeded)
    }
    assert succeeded | exhausted == set(handlers.executions)
    assert not succeeded & exhausted
