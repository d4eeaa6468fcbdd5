"""The XPENDING backlog reader against a real Redis."""

from __future__ import annotations

import pytest
import redis.asyncio

from relay.adapters.metrics.backlog import redis_backlog_reader

pytestmark = [pytest.mark.redis, pytest.mark.anyio]


async def test_pending_count_and_oldest_age(redis_url: str, unique: str) -> None:
    stream, group = f"events-{unique}", f"group-{unique}"
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
        read = redis_backlog_reader(client, stream, group)
        assert await read() == (0, 0.0, 0)
        seconds, _ = await client.time()
        old_ms = (int(seconds) - 90) * 1000  # an entry added 90 s ago (explicit id)
        await client.xadd(stream, {"event": "{}"}, id=f"{old_ms}-0")
        await client.xadd(stream, {"event": "{}"})
        await client.xreadgroup(group, "worker-1", {stream: ">"}, count=10)
        pending, age, delayed = await read()
        assert pending == 2
        assert 89 <= age < 200
        assert delayed == 0
    finally:
        await client.aclose()
