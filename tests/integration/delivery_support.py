"""Shared pieces of the delivery integration tests: a bytes Redis client and the whole
delivery path wired to the real Redis adapters (the runtime stays an in-memory fake)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio

from relay.adapters.redis.keys import dlq_key, invocation_key
from relay.adapters.redis.ledger import RedisInvocationLedger
from relay.adapters.redis.schedules import RedisOccurrenceHistory, RedisOccurrencePublisher
from relay.adapters.redis.stream import RedisEventStream
from relay.adapters.system import RandomTokenSource, SystemClock
from relay.application.bus import MessageBus
from relay.application.concurrency import Slots
from relay.application.delivery_log import subscribe_delivery_log
from relay.application.dispatch import MessageDispatcher
from relay.application.registry import ActiveFunction, FunctionRegistry
from relay.domain.commands import DispatchBatch, DispatchMessage
from relay.domain.messages import DomainEvent
from relay.domain.outcome import StreamMessage
from relay.domain.template import parse_template
from tests.fakes import InMemoryContainerRuntime, InMemorySecretStore
from tests.unit.delivery_world import DELIVERY_EVENTS


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@asynccontextmanager
async def bytes_client(request: pytest.FixtureRequest) -> AsyncIterator[redis.asyncio.Redis]:
    """A bytes client on the session Redis (``RELAY_DEV_REDIS_URL`` overrides it)."""
    url = os.environ.get("RELAY_DEV_REDIS_URL") or str(request.getfixturevalue("redis_url"))
    client = redis.asyncio.Redis.from_url(url, decode_responses=False)
    try:
        yield client
    finally:
        await client.aclose()


class RedisWorld:
    """The delivery path on Redis; ``runtime`` is scripted like the unit tests' fake
    unless a real one is given (its functions then need ``image``)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        unique: str,
        consumer: str = "w1",
        runtime: Any = None,
    ) -> None:
        self.client = client
        self.stream_name = f"{unique}-events"
        self.stream = RedisEventStream(
            client, stream=self.stream_name, group="relay", consumer=consumer
        )
        self.ledger = RedisInvocationLedger(client)
        self.occurrences = RedisOccurrencePublisher(client, self.stream_name)
        self.registry = FunctionRegistry()
        self.registry.mark_complete()  # every function of the world is declared
        self.runtime = InMemoryContainerRuntime() if runtime is None else runtime
        self.slots = Slots(8, wait_s=1.0)
        self.bus = MessageBus({})
        self.dispatcher = MessageDispatcher(
            stream=self.stream,
            ledger=self.ledger,
            registry=self.registry,
            runtime=self.runtime,
            slots=self.slots,
            secrets=InMemorySecretStore(),
            clock=SystemClock(),
            tokens=RandomTokenSource(),
            max_event_bytes=1024,
            slot_wait_s=1.0,
            notify=self.bus.emit,
            history=RedisOccurrenceHistory(client, self.stream_name, "relay"),  # as relay start
        )
        self.bus.register(DispatchMessage, self.dispatcher)
        self.bus.register(DispatchBatch, self.dispatcher.handle_batch)
        subscribe_delivery_log(self.bus)
        self.events: list[DomainEvent] = []
        for kind in DELIVERY_EVENTS:
            self.bus.subscribe(kind, self.events.append)

    def function(self, name: str, template: dict[str, Any], image: str = "img") -> None:
        parsed = parse_template({"runtime": "python3.14", **template})
        self.registry.put(
            ActiveFunction(
                name=name,
                directory=f"/functions/{name}",
                template=parsed,
                runtime="python3.14",
                image=image,
                fingerprint=None,
                prepared_at=None,
            )
        )
        self.runtime.activate(name, image, "python3.14", parsed.concurrency)

    async def dispatch(self, message: StreamMessage) -> Any:
        return await self.bus.send(DispatchMessage(message=message))

    async def dispatch_batch(
        self, messages: Sequence[StreamMessage], done: Callable[[str], None]
    ) -> Any:
        """What the loops call: the whole read as one batch."""
        return await self.bus.send(DispatchBatch(messages=tuple(messages), done=done))

    async def add(self, payload: bytes) -> str:
        return text(await self.client.xadd(self.stream_name, {"event": payload}))

    async def pending(self) -> set[str]:
        rows = await self.client.xpending_range(
            self.stream_name, "relay", min="-", max="+", count=10_000
        )
        return {text(r["message_id"]) for r in rows}

    async def ledger_hash(self, message_id: str) -> dict[str, str]:
        raw = await self.client.hgetall(invocation_key(self.stream_name, "relay", message_id))
        return {text(k): text(v) for k, v in raw.items()}

    async def expire_deadlines(self, message_id: str) -> None:
        key = invocation_key(self.stream_name, "relay", message_id)
        for field, value in (await self.ledger_hash(message_id)).items():
            kind, _, rest = value.partition(":")
            if kind in ("running", "next_attempt_at"):
                await self.client.hset(key, field, f"{kind}:1000#{rest.split('#', 1)[1]}")

    async def dlq(self) -> list[dict[str, str]]:
        rows: Any = await self.client.xrange(dlq_key(self.stream_name))
        return [{text(k): text(v) for k, v in fields.items()} for _, fields in rows]
