"""Stale consumers are removed at start, against a real Redis: only names that hold
nothing, have been idle long enough and are not the worker's own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio
from structlog.testing import capture_logs

from relay.adapters.redis.consumers import (
    STALE_CONSUMER_IDLE_MS,
    remove_stale_consumers,
    tidy_consumers,
)
from tests.integration.delivery_support import bytes_client

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


@pytest.fixture
async def bytes_redis(request: pytest.FixtureRequest) -> AsyncIterator[redis.asyncio.Redis]:
    async with bytes_client(request) as client:
        yield client


async def _group_with(client: redis.asyncio.Redis, stream: str, names: list[str]) -> None:
    """A group where each name in ``names`` has read (and so holds) one message, and
    ``gone`` and ``also-gone`` have read nothing."""
    await client.xgroup_create(stream, "relay", id="0", mkstream=True)
    for name in names:
        await client.xadd(stream, {"event": b"{}"})
        await client.xreadgroup("relay", name, {stream: ">"}, count=1)
    for name in ("gone", "also-gone", "me"):
        await client.xgroup_createconsumer(stream, "relay", name)


async def _consumers(client: redis.asyncio.Redis, stream: str) -> list[str]:
    found = await client.xinfo_consumers(stream, "relay")
    return sorted(c["name"].decode() if isinstance(c["name"], bytes) else c["name"] for c in found)


async def test_idle_consumers_holding_nothing_go_and_the_rest_stay(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    stream = f"{unique}-events"
    await _group_with(bytes_redis, stream, ["holds-one"])
    removed = await remove_stale_consumers(
        bytes_redis, stream=stream, group="relay", keep="me", min_idle_ms=0
    )
    assert removed == ["also-gone", "gone"]
    # the one with a pending entry keeps it (deleting it would lose the entry), and
    # the worker's own name is never removed
    assert await _consumers(bytes_redis, stream) == ["holds-one", "me"]
    pending = await bytes_redis.xpending(stream, "relay")
    assert pending["pending"] == 1


async def test_consumers_idle_for_less_than_the_threshold_stay(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    stream = f"{unique}-events"
    await _group_with(bytes_redis, stream, [])
    assert STALE_CONSUMER_IDLE_MS >= 60_000  # far beyond a live worker's blocking read
    removed = await remove_stale_consumers(bytes_redis, stream=stream, group="relay", keep="me")
    assert removed == []
    assert await _consumers(bytes_redis, stream) == ["also-gone", "gone", "me"]


async def test_start_up_logs_what_it_removed_and_never_fails_on_a_missing_group(
    bytes_redis: redis.asyncio.Redis, unique: str
) -> None:
    with capture_logs() as logs:
        await tidy_consumers(bytes_redis, stream=f"{unique}-none", group="relay", keep="me")
    assert [e["event"] for e in logs] == ["stale_consumers_not_removed"]
    assert "no such key" in logs[0]["error"].lower() or "nogroup" in logs[0]["error"].lower()
