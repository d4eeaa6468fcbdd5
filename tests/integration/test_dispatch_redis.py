"""The delivery path on a real Redis: round trips, retries to the DLQ, an unwritable DLQ,
malformed events, deleted bodies, competing workers and a Redis restart."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
import redis.asyncio
import redis.exceptions
from structlog.testing import capture_logs
from typer.testing import CliRunner

from relay.adapters.redis.connection import redis_client
from relay.adapters.redis.keys import dlq_key, invocation_key
from relay.adapters.redis.stream import RedisEventStream
from relay.application.buffer import MessageBuffer
from relay.application.consumer import ConnectionHealth, ConsumerLoop, RecoveryLoop
from relay.domain import events as ev
from relay.domain.execution import InvocationRequest, InvocationResult
from relay.domain.outcome import StreamMessage
from relay.entrypoints.cli import app
from tests.integration.delivery_support import RedisWorld, bytes_client
from tests.json_schemas import assert_matches_schema
from tests.unit.delivery_world import rule

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


@pytest.fixture
async def bytes_redis(request: pytest.FixtureRequest) -> AsyncIterator[redis.asyncio.Redis]:
    async with bytes_client(request) as client:
        yield client


USERS = {"events": [rule("events.created.handler", {"table": ["users"]})]}
INSERT = b'{"table": "users"}'
# Commands the adapters send themselves (everything else runs inside the scripts);
# a pipeline sends many of them in one round trip.
CLIENT_COMMANDS = ("evalsha", "eval", "xreadgroup", "xautoclaim", "xgroup|create", "script|load")


async def wait_for(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` with a deadline."""
    with anyio.fail_after(20):
        while not condition():  # noqa: ASYNC110 - polling plain attributes of the fakes
            await anyio.sleep(0.01)


async def command_calls(client: redis.asyncio.Redis) -> dict[str, int]:
    info = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in info.items()}


async def test_a_handled_event_costs_at_most_three_round_trips(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    world = RedisWorld(bytes_redis, unique)
    world.function("users", USERS)
    await world.stream.ensure_group()
    events = 200
    for _ in range(events):
        await world.add(INSERT)
    buffer = MessageBuffer(16)
    loop = ConsumerLoop(world.stream, world.dispatch_batch, buffer, block_ms=50)
    before = await command_calls(bytes_redis)
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        await wait_for(lambda: _acked(world) == events)
        tg.cancel_scope.cancel()
    after = await command_calls(bytes_redis)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    commands = sum(delta.get(name, 0) for name in CLIENT_COMMANDS)
    round_trips = world.ledger.round_trips + delta.get("xreadgroup", 0)
    print(
        f"per handled event: {commands / events:.2f} commands sent by Relay, "
        f"{round_trips / events:.2f} round trips (commandstats delta {delta})"
    )
    assert len(world.runtime.requests) == events
    # Even counting every pipelined command as its own round trip: at most 3.
    assert commands / events <= 3
    # Batched: one begin_many per read batch and one finish_many per settle group,
    # so far fewer script calls than events (per message it was two).
    assert delta["evalsha"] <= events // 2
    assert round_trips / events < 1


def _acked(world: RedisWorld) -> int:
    return sum(1 for e in world.events if isinstance(e, ev.MessageAcknowledged))


async def redeliver(world: RedisWorld, message_id: str) -> Any:
    raw: Any = await world.client.xrange(world.stream_name, message_id, message_id)
    payload = raw[0][1].get(b"event")
    return await world.dispatch(StreamMessage(id=message_id, payload=payload, reclaimed=True))


async def test_an_always_failing_handler_runs_exactly_one_plus_retries_times(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    world = RedisWorld(bytes_redis, unique)
    world.function(
        "users", {"events": [rule("events.bad.handler", {"table": ["users"]}, retries=3)]}
    )
    world.runtime.script["users/events.bad.handler"] = InvocationResult(ok=False, error="exit 1")
    await world.stream.ensure_group()
    await world.add(INSERT)
    [message] = await world.stream.read(1, 10)
    report = await world.dispatch(message)
    for _ in range(10):
        if report.acknowledged:
            break
        await world.expire_deadlines(message.id)
        report = await redeliver(world, message.id)
    assert report.outcome == "dead_lettered"
    assert len(world.runtime.requests) == 4
    [entry] = await world.dlq()
    assert (entry["function"], entry["handler"], entry["handler_attempts"]) == (
        "users",
        "events.bad.handler",
        "4",
    )
    assert entry["event"] == INSERT.decode()
    assert message.id not in await world.pending()
    key = f"relay:invocation:{world.stream_name}:relay:{message.id}"
    assert await bytes_redis.ttl(key) > 0


async def test_an_unwritable_dlq_keeps_the_message_then_routes_it_without_rerunning(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    world = RedisWorld(bytes_redis, unique)
    world.function(
        "users", {"events": [rule("events.bad.handler", {"table": ["users"]}, retries=0)]}
    )
    world.runtime.script["users/events.bad.handler"] = InvocationResult(ok=False, error="boom")
    await world.stream.ensure_group()
    await bytes_redis.set(dlq_key(world.stream_name), "not a stream")
    await world.add(INSERT)
    [message] = await world.stream.read(1, 10)
    report = await world.dispatch(message)
    assert (report.acknowledged, report.outcome) == (False, "dlq_failed")
    assert message.id in await world.pending()
    await bytes_redis.delete(dlq_key(world.stream_name))
    again = await redeliver(world, message.id)
    assert (again.acknowledged, again.outcome) == (True, "dead_lettered")
    assert len(world.runtime.requests) == 1
    assert len(await world.dlq()) == 1


@pytest.mark.parametrize(
    "payload", [b"[1, 2]", b"{nope", b'{"table": "users", "pad": "' + b"x" * 2000 + b'"}']
)
async def test_malformed_events_go_to_the_dlq_at_once(
    bytes_redis: redis.asyncio.Redis, unique: str, payload: bytes
) -> None:
    world = RedisWorld(bytes_redis, unique)
    world.function("users", USERS)
    await world.stream.ensure_group()
    await world.add(payload)
    [message] = await world.stream.read(1, 10)
    report = await world.dispatch(message)
    assert (report.acknowledged, report.outcome) == (True, "malformed")
    assert world.runtime.requests == []
    assert not [e for e in world.events if isinstance(e, ev.EventClassified)]
    [entry] = await world.dlq()
    assert (entry["function"], entry["handler"], entry["handler_attempts"]) == ("-", "-", "0")
    assert await world.pending() == set()


async def test_a_deleted_pending_body_is_counted_and_dropped_never_run(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    world = RedisWorld(bytes_redis, unique)
    world.function("users", USERS)
    await world.stream.ensure_group()
    gone = await world.add(INSERT)
    await world.stream.read(1, 10)
    await bytes_redis.xdel(world.stream_name, gone)
    published: list[Any] = []

    loop = RecoveryLoop(
        world.stream, world.dispatch_batch, MessageBuffer(4), emit=published.append,
        min_idle_ms=0,
    )
    async with anyio.create_task_group() as tg:
        assert await loop.tick(tg) == 0
    assert published == [ev.PendingEntryDropped(message_id=gone)]
    assert world.runtime.requests == []
    assert await world.pending() == set()


async def test_a_dropped_entry_s_ledger_hash_gets_the_ledger_retention_ttl(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    """A message that ran once (a retry is due, so its hash has no TTL) loses its
    body; the recovery loop drops it, and its ledger hash must then expire after
    LEDGER_RETENTION like an acknowledged message's, not stay forever."""
    world = RedisWorld(bytes_redis, unique)
    world.function(
        "users", {"events": [rule("events.bad.handler", {"table": ["users"]}, retries=3)]}
    )
    world.runtime.script["users/events.bad.handler"] = InvocationResult(ok=False, error="exit 1")
    await world.stream.ensure_group()
    gone = await world.add(INSERT)
    [message] = await world.stream.read(1, 10)
    assert (await world.dispatch(message)).acknowledged is False
    key = invocation_key(world.stream_name, "relay", gone)
    assert await bytes_redis.ttl(key) == -1  # pending: the hash never expires
    await bytes_redis.xdel(world.stream_name, gone)
    stream = RedisEventStream(
        bytes_redis, stream=world.stream_name, group="relay", consumer="w1", ledger_ttl_s=7200
    )
    loop = RecoveryLoop(stream, world.dispatch_batch, MessageBuffer(4), min_idle_ms=0)
    async with anyio.create_task_group() as tg:
        assert await loop.tick(tg) == 0
    assert await world.pending() == set()
    assert 7000 < await bytes_redis.ttl(key) <= 7200
    assert len(world.runtime.requests) == 1  # dropped, never run again


async def test_two_workers_on_one_message_run_the_handler_once(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    first = RedisWorld(bytes_redis, unique, consumer="w1")
    second = RedisWorld(bytes_redis, unique, consumer="w2")
    release = anyio.Event()
    runs: list[str] = []

    async def slow(request: InvocationRequest) -> InvocationResult:
        runs.append(request.context)
        await release.wait()
        return InvocationResult(ok=True)

    for world in (first, second):
        world.function("users", USERS)
        world.runtime.script["users/events.created.handler"] = slow
    await first.stream.ensure_group()
    await first.add(INSERT)
    [message] = await first.stream.read(1, 10)
    reports: list[Any] = []

    async def run(world: RedisWorld) -> None:
        reports.append(await world.dispatch(message))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, first)
        tg.start_soon(run, second)
        await wait_for(lambda: len(reports) == 1 and len(runs) == 1)
        release.set()
    assert len(runs) == 1
    assert sorted(r.outcome for r in reports) == ["completed", "in_progress"]


@pytest.mark.docker
async def test_the_consumer_recovers_from_a_redis_restart(restartable_redis: Any) -> None:
    client = redis_client(restartable_redis.url)  # the production client: reconnect retry included
    try:
        world = RedisWorld(client, "restart")
        world.function("users", USERS)
        health = ConnectionHealth("consumer", min_s=0.05, max_s=0.2)
        loop = ConsumerLoop(
            world.stream, world.dispatch_batch, MessageBuffer(4), block_ms=100, health=health
        )
        async with anyio.create_task_group() as tg:
            await tg.start(loop.run)
            await world.add(INSERT)
            await wait_for(lambda: _acked(world) == 1)
            await anyio.to_thread.run_sync(restartable_redis.stop)
            await wait_for(lambda: not health.healthy)
            await anyio.to_thread.run_sync(restartable_redis.start)
            # After the restart the stream and group are new; the test's own client
            # may first hit a pooled connection the restart closed.
            with anyio.fail_after(10):
                while not await _try_add(world):  # noqa: ASYNC110 - retrying a command
                    await anyio.sleep(0.05)
            await wait_for(lambda: _acked(world) == 2)
            tg.cancel_scope.cancel()
        assert health.healthy
        assert len(world.runtime.requests) == 2
    finally:
        await client.aclose()


async def _try_add(world: RedisWorld) -> bool:
    try:
        await world.add(INSERT)
    except redis.exceptions.ConnectionError:
        return False
    return True


@pytest.mark.docker
async def test_a_frozen_redis_is_noticed_and_survived(restartable_redis: Any) -> None:
    client = redis_client(restartable_redis.url)  # the production client: reconnect retry included
    try:
        world = RedisWorld(client, "paused")
        world.function("users", USERS)
        health = ConnectionHealth("consumer", min_s=0.05, max_s=0.2)
        loop = ConsumerLoop(
            world.stream,
            world.dispatch_batch,
            MessageBuffer(4),
            block_ms=100,
            health=health,
            call_timeout_s=0.5,
        )
        async with anyio.create_task_group() as tg:
            await tg.start(loop.run)
            with capture_logs() as logs:
                await anyio.to_thread.run_sync(restartable_redis.pause)
                await wait_for(lambda: not health.healthy)
            # one line that says what is wrong
            [down] = [e for e in logs if e["event"] == "broker_unavailable"]
            assert down["error"] == "redis XREADGROUP failed: no answer 0.5s after the block time"
            await anyio.to_thread.run_sync(restartable_redis.unpause)
            with anyio.fail_after(10):
                while not await _try_add(world):  # noqa: ASYNC110 - retrying a command
                    await anyio.sleep(0.05)
            await wait_for(lambda: _acked(world) == 1)
            tg.cancel_scope.cancel()
        assert health.healthy
    finally:
        await client.aclose()


async def test_trace_shows_the_last_error_while_the_invocation_backs_off(
    bytes_redis: redis.asyncio.Redis, unique: str, redis_url: str
) -> None:
    """A failed attempt that will be retried keeps its error in the ledger hash
    (``@err:<field>``, as ``ledger_rules`` says): ``relay trace`` shows it with the
    attempt and the next attempt time, not only once retries are exhausted."""
    world = RedisWorld(bytes_redis, unique)
    world.function(
        "users", {"events": [rule("events.bad.handler", {"table": ["users"]}, retries=3)]}
    )
    error = 'function "users" handler "events.bad.handler": ValueError: first try'
    world.runtime.script["users/events.bad.handler"] = InvocationResult(ok=False, error=error)
    await world.stream.ensure_group()
    await world.add(INSERT)
    [message] = await world.stream.read(1, 10)
    report = await world.dispatch(message)
    assert not report.acknowledged
    env = {"REDIS_URI": redis_url, "REDIS_STREAM": world.stream_name, "REDIS_GROUP": "relay"}
    text, doc = await anyio.to_thread.run_sync(_trace, message.id, env)
    assert "attempt 1 failed; next attempt at" in text
    assert f"last error: {error}" in text
    [invocation] = doc["invocations"]
    assert (invocation["state"], invocation["attempt"]) == ("backing_off", 1)
    assert invocation["last_error"] == error
    assert invocation["deadline"].endswith("Z")


def _trace(message_id: str, env: dict[str, str]) -> tuple[str, dict[str, Any]]:
    text = CliRunner().invoke(app, ["trace", message_id], env=env)
    assert text.exit_code == 0, text.output
    as_json = CliRunner().invoke(app, ["trace", message_id, "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    return text.stdout, assert_matches_schema(as_json.stdout)
