"""RedisInvocationLedger specifics beyond the shared contract suite (tests/contract)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
import redis.asyncio

from relay.adapters.redis.keys import invocation_key
from relay.adapters.redis.ledger import RedisInvocationLedger
from relay.adapters.redis.stream import RedisEventStream
from relay.domain.outcome import BeginRequest, ClaimRequest, MessageContext
from tests.integration.delivery_support import bytes_client, text

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


@pytest.fixture
async def bytes_redis(request: pytest.FixtureRequest) -> AsyncIterator[redis.asyncio.Redis]:
    async with bytes_client(request) as client:
        yield client


FIELD = "fn/events.handler"


async def setup(client: redis.asyncio.Redis, stream_name: str) -> tuple[MessageContext, str]:
    stream = RedisEventStream(client, stream=stream_name, group="g:1", consumer="w1")
    await stream.ensure_group()
    await client.xadd(stream_name, {"event": b"{}"})
    [message] = await stream.read(1, 10)
    ctx = MessageContext(
        stream=stream_name, group="g:1", consumer="w1", message_id=message.id, timestamp="now"
    )
    return ctx, message.id


def claim(ctx: MessageContext, token: str, lease_ms: int = 30_000) -> BeginRequest:
    return BeginRequest(
        context=ctx,
        classification="matched:fn",
        token=token,
        claims=(ClaimRequest(field=FIELD, max_attempts=5, lease_ms=lease_ms),),
        gates=(FIELD,),
    )


async def test_keys_percent_encode_stream_and_group(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    ctx, message_id = await setup(bytes_redis, f"{unique}:odd/name")
    await RedisInvocationLedger(bytes_redis).begin(claim(ctx, "tok"))
    key = f"relay:invocation:{unique}%3Aodd%2Fname:g%3A1:{message_id}"
    assert key == invocation_key(f"{unique}:odd/name", "g:1", message_id)
    assert await bytes_redis.exists(key) == 1


async def test_deadlines_come_from_the_server_clock(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    ctx, _ = await setup(bytes_redis, f"{unique}-events")
    seconds, micros = await bytes_redis.time()
    before = seconds * 1000 + micros // 1000
    result = await RedisInvocationLedger(bytes_redis).begin(claim(ctx, "tok", lease_ms=30_000))
    seconds, micros = await bytes_redis.time()
    after = seconds * 1000 + micros // 1000
    assert before + 30_000 <= result.statuses[0].until_ms <= after + 30_000


async def test_scripts_reload_after_a_script_flush(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    ctx, message_id = await setup(bytes_redis, f"{unique}-events")
    ledger = RedisInvocationLedger(bytes_redis)
    await bytes_redis.script_flush()  # as after a Redis restart
    result = await ledger.begin(claim(ctx, "tok"))
    assert result.statuses[0].status == "claimed"
    marker = text(await bytes_redis.hget(invocation_key(ctx.stream, ctx.group, message_id), FIELD))
    assert marker.endswith("#1#tok")


async def test_concurrent_calls_share_pipelined_round_trips_even_after_a_flush(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    stream = RedisEventStream(bytes_redis, stream=f"{unique}-events", group="g", consumer="w1")
    await stream.ensure_group()
    for _ in range(20):
        await bytes_redis.xadd(stream.stream, {"event": b"{}"})
    messages = await stream.read(20, 10)
    ledger = RedisInvocationLedger(bytes_redis)
    await bytes_redis.script_flush()
    results: list[str] = []

    async def claim_one(message_id: str, token: str) -> None:
        ctx = MessageContext(
            stream=stream.stream, group="g", consumer="w1", message_id=message_id, timestamp="t"
        )
        result = await ledger.begin(claim(ctx, token))
        results.append(result.statuses[0].status)

    async with anyio.create_task_group() as tg:
        for message in messages:
            tg.start_soon(claim_one, message.id, "tok")
    assert results == ["claimed"] * 20
    assert ledger.round_trips <= 3  # one SCRIPT LOAD, then one or two pipelines
    await bytes_redis.script_flush()  # a restart while the worker runs
    results.clear()
    async with anyio.create_task_group() as tg:
        for message in messages:
            tg.start_soon(claim_one, message.id, "another-worker")
    assert results == ["running"] * 20


async def test_sustained_calls_pass_the_sender_role_on_and_all_succeed(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    stream = RedisEventStream(bytes_redis, stream=f"{unique}-events", group="g", consumer="w1")
    await stream.ensure_group()
    for _ in range(50):
        await bytes_redis.xadd(stream.stream, {"event": b"{}"})
    messages = await stream.read(50, 10)
    ledger = RedisInvocationLedger(bytes_redis)
    ledger._channel._timeout_s = 1.0  # shorter than the load below lasts
    failures: list[BaseException] = []
    calls = 0
    stop_at = anyio.current_time() + 2.5

    async def keep_calling(message_id: str) -> None:
        nonlocal calls
        ctx = MessageContext(
            stream=stream.stream, group="g", consumer="w1", message_id=message_id, timestamp="t"
        )
        step = 0
        while anyio.current_time() < stop_at:
            step += 1
            # Staggered arrivals: some call always lands while a round is in flight.
            await anyio.sleep((hash((message_id, step)) % 7) / 4000)
            try:
                await ledger.begin(claim(ctx, "tok"))
                calls += 1
            except Exception as exc:
                failures.append(exc)

    async with anyio.create_task_group() as tg:
        for message in messages:
            tg.start_soon(keep_calling, message.id)
    assert failures == []
    assert calls > 50
    assert ledger.round_trips < calls
