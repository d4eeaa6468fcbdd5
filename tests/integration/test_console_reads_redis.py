"""The console's reads on the Redis broker, over the worker's own client: a
message's trace (the facts ``relay trace`` prints), the dead letters, the backlog."""

from __future__ import annotations

from contextlib import AsyncExitStack
from types import SimpleNamespace
from typing import Any

import pytest
import redis.asyncio

from relay.adapters.brokers import open_broker
from relay.adapters.redis.keys import dlq_key
from relay.adapters.system import SystemClock
from relay.domain.dlq_selection import Selection
from relay.domain.outcome import DeadLetterEntry
from relay.domain.publication import DEFAULT_DEDUP_WINDOW_NS
from relay.entrypoints.cli.trace_render import render_trace
from relay.entrypoints.console.reads import ConsoleReads

pytestmark = [pytest.mark.redis, pytest.mark.anyio]


async def test_trace_dead_letters_and_backlog_through_the_workers_client(
    redis_url: str, unique: str
) -> None:
    stream, group = f"events-{unique}", f"group-{unique}"
    settings = SimpleNamespace(
        broker=SimpleNamespace(embedded=False),
        redis=SimpleNamespace(url=redis_url, stream=stream, group=group),
        hostname=f"console-{unique}", ledger_retention_ns=3600 * 10**9,
        stream_retention_ns=None, dlq_retention_ns=None,
        publish_dedup_window_ns=DEFAULT_DEDUP_WINDOW_NS,
    )
    async with AsyncExitStack() as stack:
        broker = await open_broker(stack, settings, SystemClock())
        reads = ConsoleReads(broker, stream=stream, group=group)
        # the test's own writes (typed loosely, as the driver's stubs want bytes keys)
        client: Any = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
        stack.push_async_callback(client.aclose)
        try:
            message_id = await client.xadd(stream, {"event": '{"kind": "x"}'})
            entry = DeadLetterEntry(original_stream=stream, original_id=message_id,
                                    group=group, consumer="w", event='{"kind": "x"}',
                                    reason="boom", function="fn", handler="h")
            await client.xadd(dlq_key(stream), entry.fields())
            lines = render_trace(await reads.trace(message_id))
            assert lines[0] == f"Message:      {message_id} (stream {stream}, group {group})"
            assert lines[1].startswith("Event:        present (")
            assert any(line.startswith("Dead letters:") for line in lines)
            assert any("fn/h" in line and "boom" in line for line in lines)
            found = await reads.dead_letters(Selection(function="fn"))
            assert (found.total, [s.entry.original_id for s in found.entries]) == (
                1, [message_id])
            assert tuple(await reads.backlog()) == (0, 0.0, 0)  # pending, oldest age, delayed
            assert reads.broker_name == "redis"
        finally:
            await client.delete(stream, dlq_key(stream))
