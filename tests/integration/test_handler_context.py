"""The handler's context variables in real warm containers: Python over Relay's
socket and over the attach stream, Node; and through the dispatcher on a real
Redis: the attempt counted across a retry, a schedule occurrence's id."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio

from relay.adapters.docker.containers import ExecutionContainer
from relay.domain import schedule
from relay.domain.handler_context import HandlerContext
from relay.domain.outcome import StreamMessage
from tests.integration.delivery_support import RedisWorld, bytes_client
from tests.integration.runtime_support import (
    BOTH_WAYS,
    assert_ok,
    built_image,
    request,
    runtime_for,
)
from tests.shared_run import SharedImages
from tests.testbed import DockerEngine
from tests.unit.delivery_world import rule

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

PY, NODE = "python3.14", "node24"
FN = "context-fn"
SHOWN = ["RELAY_HANDLER", "RELAY_MESSAGE_ID", "RELAY_ATTEMPT", "RELAY_DEADLINE"]
OCCURRENCE = "schedule:context-fn:probe.hello:2026-06-01T03:00:00Z"


def deadline(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


@pytest.fixture(scope="module")
def py_image(docker_engine: DockerEngine, shared_images: SharedImages) -> str:
    return built_image(shared_images, PY)


@pytest.fixture(scope="module")
def node_image(docker_engine: DockerEngine, shared_images: SharedImages) -> str:
    docker_engine.require_image("node:24-alpine")
    return built_image(shared_images, NODE)


@pytest.fixture
async def bytes_redis(request: pytest.FixtureRequest) -> AsyncIterator[redis.asyncio.Redis]:
    async with bytes_client(request) as client:
        yield client


async def two_invocations(runtime: Any, captured: Any) -> list[dict[str, Any]]:
    """An occurrence's run, then an event's, on the same warm container: what each saw."""
    show = {"show": [*SHOWN, "RELAY_OCCURRENCE_ID"]}
    first = HandlerContext(message_id="1700000000000-0", attempt=3, occurrence_id=OCCURRENCE)
    second = HandlerContext(message_id="1700000000001-0", attempt=1)
    before = time.time()
    assert_ok(
        await runtime.invoke(
            request(FN, "probe.hello", show, timeout_ns=20_000_000_000, handler_context=first)
        )
    )
    assert_ok(await runtime.invoke(request(FN, "probe.hello", show, handler_context=second)))
    after = time.time()
    seen = [line["env"] for line in captured.tagged("HELLO")]
    assert [line["count"] for line in captured.tagged("HELLO")] == [1, 2]  # one warm process
    snap = runtime.snapshot(FN)
    assert (snap.cold_starts, snap.warm_acquires) == (1, 1)
    first_deadline = deadline(seen[0].pop("RELAY_DEADLINE"))
    second_deadline = deadline(seen[1].pop("RELAY_DEADLINE"))
    assert before + 20 - 0.001 <= first_deadline <= after + 20  # that request's 20s timeout
    assert before + 6 - 0.001 <= second_deadline <= after + 6  # the default 6s
    return seen


def expected(occurrence: str | None, message: str, attempt: str) -> dict[str, Any]:
    return {
        "RELAY_HANDLER": "probe.hello",
        "RELAY_MESSAGE_ID": message,
        "RELAY_ATTEMPT": attempt,
        "RELAY_OCCURRENCE_ID": occurrence,
    }


@BOTH_WAYS
async def test_python_handlers_see_their_own_context_on_a_reused_container(
    py_image: str, unique: str, direct: bool
) -> None:
    async with runtime_for(f"w-{unique}", direct=direct) as (runtime, captured, _):
        runtime.activate(FN, py_image, PY, 1)
        first, second = await two_invocations(runtime, captured)
        (idle,) = runtime._pools[FN].idle
        assert isinstance(idle, ExecutionContainer)
        # the way asked for is the way taken
        assert (idle.direct is not None and idle.direct.link is not None) is direct
    assert first == expected(OCCURRENCE, "1700000000000-0", "3")
    # the occurrence id is gone again: the next request did not set it
    assert second == expected(None, "1700000000001-0", "1")


async def test_node_handlers_see_their_own_context_on_a_reused_container(
    node_image: str, unique: str
) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        runtime.activate(FN, node_image, NODE, 1)
        first, second = await two_invocations(runtime, captured)
    assert first == expected(OCCURRENCE, "1700000000000-0", "3")
    assert second == expected(None, "1700000000001-0", "1")


# --- through the dispatcher, on a real Redis ------------------------------------------
def contexts(captured: Any) -> list[dict[str, Any]]:
    seen = captured.tagged("CONTEXT")
    for values in seen:
        assert deadline(values.pop("RELAY_DEADLINE")) > 0
    return list(seen)


@pytest.mark.redis
async def test_a_retried_message_keeps_its_id_and_counts_its_attempts(
    py_image: str, bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        world = RedisWorld(bytes_redis, unique, runtime=runtime)
        world.function(FN, {"events": [rule("probe.context", {"kind": ["job"]})]}, image=py_image)
        await world.stream.ensure_group()
        message_id = await world.add(json.dumps({"kind": "job", "fail_first": True}).encode())
        [message] = await world.stream.read(1, 10)
        first = await world.dispatch(message)
        assert (first.acknowledged, first.outcome) == (False, "retrying")
        await world.expire_deadlines(message_id)
        again = StreamMessage(id=message_id, payload=message.payload, reclaimed=True)
        assert (await world.dispatch(again)).acknowledged
    assert contexts(captured) == [
        {
            "RELAY_HANDLER": "probe.context",
            "RELAY_MESSAGE_ID": message_id,
            "RELAY_ATTEMPT": attempt,
            "RELAY_OCCURRENCE_ID": None,
        }
        for attempt in ("1", "2")
    ]


@pytest.mark.redis
async def test_a_schedule_occurrence_tells_its_handler_its_occurrence_id(
    py_image: str, bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        world = RedisWorld(bytes_redis, unique, runtime=runtime)
        nightly = {"handler": "probe.context", "cron": "0 3 * * *"}
        world.function(FN, {"schedules": [nightly]}, image=py_image)
        await world.stream.ensure_group()
        # yesterday's 03:00 firing: an occurrence due more than 7 days before its
        # delivery is dead-lettered, never run (failure row 215)
        midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        at = int((midnight - timedelta(days=1)).timestamp()) + 3 * 3600
        occurrence = schedule.envelope(FN, "probe.context", at)
        message_id = await world.occurrences.publish(occurrence)  # a copy would not run
        [message] = await world.stream.read(1, 10)
        assert (await world.dispatch(message)).acknowledged
    assert contexts(captured) == [
        {
            "RELAY_HANDLER": "probe.context",
            "RELAY_MESSAGE_ID": message_id,
            "RELAY_ATTEMPT": "1",
            "RELAY_OCCURRENCE_ID": occurrence.occurrence_id,
        }
    ]
