"""Defect 7 of the review, with a real container and a real Redis: the claim's lease
was counted from ``begin`` while the handler's timer started only after the cold
start, so a slow start plus a full-length run outlived the lease and another worker
could run the next attempt at the same time. Now the worker renews the claim right
before the handler starts whenever what is left would not cover its timeout.

The lease's grace is shrunk to 150 ms here so that an ordinary container start (a
few hundred milliseconds on this engine) is already "slow"; production keeps 5 s.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import anyio
import pytest
import redis.asyncio

from relay.adapters.redis.keys import invocation_key
from relay.adapters.redis.ledger import RedisInvocationLedger
from relay.adapters.redis.stream import RedisEventStream
from relay.adapters.system import RandomTokenSource, SystemClock
from relay.application.bus import MessageBus
from relay.application.concurrency import Slots
from relay.application.delivery_log import subscribe_delivery_log
from relay.application.dispatch import MessageDispatcher
from relay.application.registry import ActiveFunction, FunctionRegistry
from relay.domain import events as ev
from relay.domain.commands import DispatchMessage
from relay.domain.invocation import Running, parse_marker
from relay.domain.messages import DomainEvent
from relay.domain.template import parse_template
from tests.fakes import InMemorySecretStore
from tests.integration.delivery_support import bytes_client, text
from tests.integration.runtime_support import built_image, poll, runtime_for
from tests.shared_run import SharedImages
from tests.testbed import DockerEngine

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.docker]

PY = "python3.14"
FN = "lease-fn"
TIMEOUT_MS = 2_000


@pytest.fixture(scope="module")
def image(docker_engine: DockerEngine, shared_images: SharedImages) -> str:
    return built_image(shared_images, PY)


@pytest.fixture
async def bytes_redis(request: pytest.FixtureRequest) -> AsyncIterator[redis.asyncio.Redis]:
    async with bytes_client(request) as client:
        yield client


async def test_a_cold_start_never_eats_into_the_handlers_lease(
    image: str, unique: str, bytes_redis: redis.asyncio.Redis
) -> None:
    stream = RedisEventStream(bytes_redis, stream=f"{unique}-events", group="relay", consumer="w1")
    await stream.ensure_group()
    registry = FunctionRegistry()
    registry.mark_complete()
    template = parse_template(
        {
            "runtime": PY,
            "events": [{"handler": "lease_probe.sleep", "pattern": {"s": [1]}, "timeout": "2s"}],
        }
    )
    events: list[DomainEvent] = []
    async with runtime_for(f"w-{unique}") as (runtime, captured, _docker):
        runtime.activate(FN, image, PY, 1)
        registry.put(
            ActiveFunction(
                name=FN,
                directory="/functions/lease-fn",
                template=template,
                runtime=PY,
                image=image,
                fingerprint=None,
                prepared_at=None,
            )
        )
        bus = MessageBus({})
        dispatcher = MessageDispatcher(
            stream=stream,
            ledger=RedisInvocationLedger(bytes_redis),
            registry=registry,
            runtime=runtime,
            slots=Slots(4, wait_s=0.01),
            secrets=InMemorySecretStore(),
            clock=SystemClock(),
            tokens=RandomTokenSource(),
            max_event_bytes=1024,
            slot_wait_s=0.01,
            notify=bus.emit,
            lease_grace_ms=150,
        )
        bus.register(DispatchMessage, dispatcher)
        subscribe_delivery_log(bus)
        for kind in (ev.LeaseRenewed, ev.InvocationSucceeded, ev.MessageAcknowledged):
            bus.subscribe(kind, events.append)
        message_id = text(await bytes_redis.xadd(stream.stream, {"event": json.dumps({"s": 1})}))
        [message] = await stream.read(1, 10)
        key = invocation_key(stream.stream, "relay", message_id)
        seen: list[int] = []

        let_start_ms: list[int] = []  # when the worker let the handler start (host clock)
        bus.subscribe(ev.InvocationStarted, lambda _e: let_start_ms.append(time.time_ns() // 10**6))

        async def deadline_left_when_the_handler_started() -> bool:
            if not any('": STARTED ' in line for line in captured.lines):
                return False
            marker = parse_marker(text(await bytes_redis.hget(key, f"{FN}/lease_probe.sleep")))
            assert isinstance(marker, Running)
            seen.append(marker.deadline_ms - let_start_ms[0])
            return True

        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.send, DispatchMessage(message=message))
            await poll(deadline_left_when_the_handler_started, what="the handler to start")
        # The whole timeout was still ahead of the claim when the handler was let start
        # (Redis runs on this host: one clock).
        assert seen[0] >= TIMEOUT_MS
        assert [type(e) for e in events] == [
            ev.LeaseRenewed,
            ev.InvocationSucceeded,
            ev.MessageAcknowledged,
        ]
