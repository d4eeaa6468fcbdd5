"""The consumer group's backlog, read from Redis for the 15-second sampler."""

from __future__ import annotations

from typing import Any

from relay.adapters.metrics.server import Backlog, BacklogReader
from relay.adapters.redis.keys import delayed_key


def redis_backlog_reader(client: Any, stream: str, group: str) -> BacklogReader:
    """An async ``() -> (pending, oldest age s, delayed)`` over ``XPENDING``
    (summary form) and ``ZCARD`` of the stream's delayed set.

    The age is measured on the Redis server's clock (``TIME``) against the oldest
    pending id's millisecond timestamp, so a skewed worker clock cannot distort it.
    ``client`` is a ``redis.asyncio.Redis``.
    """

    async def read() -> Backlog:
        summary = await client.xpending(stream, group)
        delayed = int(await client.zcard(delayed_key(stream)))
        pending = int(summary.get("pending") or 0)
        oldest = summary.get("min")
        if not pending or not oldest:
            return Backlog(pending, 0.0, delayed)
        seconds, micros = await client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        text = oldest.decode() if isinstance(oldest, bytes) else str(oldest)
        added_ms = int(text.split("-", 1)[0])
        return Backlog(pending, max(0.0, (now_ms - added_ms) / 1000), delayed)

    return read
