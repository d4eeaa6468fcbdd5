"""``POST /v1/events`` on the Redis broker, over real HTTP: the entries a worker
reads, and a Redis that goes away during a POST (503, nothing acknowledged)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from relay.adapters.fs.secrets import FileSecretStore
from relay.adapters.ingest.server import IngestServer
from relay.adapters.ingest.tokens import IngestTokens
from relay.adapters.metrics.ingest import subscribe_ingest
from relay.adapters.redis.producer import RedisEventPublisher
from relay.application.bus import MessageBus
from tests.testbed import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


@asynccontextmanager
async def _serve(
    url: str, stream: str, tmp: Any
) -> AsyncIterator[tuple[str, redis.asyncio.Redis, CollectorRegistry]]:
    """A loopback endpoint without a token (allowed on loopback only) on ``stream``."""
    client = redis.asyncio.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    bus = MessageBus({})
    registry = CollectorRegistry()
    subscribe_ingest(bus, registry)
    server = IngestServer(
        "127.0.0.1", 0, publisher=RedisEventPublisher(client, stream),
        tokens=IngestTokens(FileSecretStore(tmp / "secrets"), None), notify=bus.emit,
        max_event_bytes=1024, read_deadline_s=5.0,
    )
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(server.run)
            yield f"http://127.0.0.1:{server.bound_port}/v1/events", client, registry
            tg.cancel_scope.cancel()
    finally:
        await client.aclose()


async def _post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
        return response.status, await response.json()


async def test_an_array_becomes_stream_entries_a_worker_reads(
    redis_url: str, unique: str, tmp_path: Any
) -> None:
    stream = f"{unique}-events"
    async with _serve(redis_url, stream, tmp_path) as (url, client, _):
        status, body = await _post(url, [{"event": {"n": 1}, "priority": "low"},
                                         {"event": {"n": 2}}])
        assert status == 202
        entries: Any = await client.xrange(stream)
        assert [i.decode() for i, _ in entries] == body["ids"]
        assert [fields for _, fields in entries] == [{b"event": b'{"n":1}'},
                                                     {b"event": b'{"n":2}'}]


async def test_redis_down_during_a_post_is_503_and_nothing_is_acknowledged(
    restartable_redis: RedisServer, unique: str, tmp_path: Any
) -> None:
    """Row 381: the answer names no address and no exception, and holds no id;
    once Redis is back, the refused event is not in the stream and a retry lands."""
    stream = f"{unique}-events"
    async with _serve(restartable_redis.url, stream, tmp_path) as (url, client, registry):
        status, before = await _post(url, {"event": {"n": "before"}})
        assert status == 202
        await anyio.to_thread.run_sync(restartable_redis.stop)
        status, refused = await _post(url, {"event": {"n": "during"}})
        assert (status, refused) == (
            503, {"error": "broker unavailable; nothing was acknowledged, retry later"})
        assert registry.get_sample_value("ingest_requests_total", {"status": "503"}) == 1
        await anyio.to_thread.run_sync(restartable_redis.start)
        with anyio.fail_after(30):
            while (answer := await _post(url, {"event": {"n": "after"}}))[0] != 202:  # noqa: ASYNC110 - polling a restarting server
                await anyio.sleep(0.2)  # the client reconnects on its next command
        found: Any = await client.xrange(stream)
        entries = {i.decode(): fields[b"event"] for i, fields in found}
        # (this Redis keeps nothing over a restart: "before" went with it)
        assert list(entries.values()) == [b'{"n":"after"}']
        assert list(entries) == answer[1]["ids"]
        assert before["ids"][0] not in entries
