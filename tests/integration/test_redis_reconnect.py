"""Relay's Redis client after a Redis restart: pooled connections the restart closed
are replaced on their next use instead of failing that one call.

Without this, the first ledger call per stale pooled connection after a restart
failed (``ledger_unavailable``): a claim left its message pending until the
recovery loop (up to two minutes), a lost ``finish`` re-ran a completed handler.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import redis.exceptions

from relay.adapters.redis.connection import redis_client
from relay.adapters.redis.stream import RedisEventStream
from relay.domain.errors import DependencyUnavailable

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.docker]


async def test_the_first_calls_after_a_restart_succeed(restartable_redis: Any) -> None:
    client = redis_client(restartable_redis.url)
    try:
        # Two connections in the pool, both closed by the restart below.
        async def ping() -> None:
            await client.ping()

        async def block() -> None:
            await client.blpop(["relay-reconnect-none"], 0.2)

        async with anyio.create_task_group() as tg:
            tg.start_soon(ping)
            tg.start_soon(block)
        await anyio.to_thread.run_sync(restartable_redis.restart)

        assert await client.set("k", "v")
        async with client.pipeline(transaction=False) as pipe:
            pipe.set("a", "1")
            pipe.get("a")
            assert await pipe.execute() == [True, b"1"]
        assert await client.get("k") == b"v"
    finally:
        await client.aclose()


async def test_a_server_that_is_down_still_fails_at_once(restartable_redis: Any) -> None:
    client = redis_client(restartable_redis.url)
    try:
        await client.ping()
        await anyio.to_thread.run_sync(restartable_redis.stop)
        with anyio.fail_after(5), pytest.raises(redis.exceptions.ConnectionError):
            await client.ping()
    finally:
        await client.aclose()


async def test_the_consumer_reads_again_after_a_restart_and_fails_at_once_when_down(
    restartable_redis: Any,
) -> None:
    client = redis_client(restartable_redis.url)
    stream = RedisEventStream(client, stream="relay-reconnect", group="relay", consumer="w1")
    try:
        await stream.ensure_group()
        assert await stream.read(10, 10) == []  # the read connection is open now
        await anyio.to_thread.run_sync(restartable_redis.restart)
        await client.xadd("relay-reconnect", {"event": b"{}"})  # the group is gone too
        with anyio.fail_after(10):
            [message] = await stream.read(10, 10)  # reopened, group recreated, read
        assert message.payload == b"{}"
        await anyio.to_thread.run_sync(restartable_redis.stop)
        with anyio.fail_after(5), pytest.raises(DependencyUnavailable, match="XREADGROUP"):
            await stream.read(10, 10)
    finally:
        await client.aclose()
