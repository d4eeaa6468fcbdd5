"""The selected broker's :class:`EventPublisher`, for the commands that append events.

Each broker's client is imported on its own path only (start-up stays light:
docs/cli.md, Startup). An unreachable Redis is one :class:`DependencyUnavailable` line.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from relay.domain.publication import DEFAULT_DEDUP_WINDOW_NS
from relay.entrypoints.cli.brokers import open_store
from relay.entrypoints.config import BrokerSettings, RedisSettings

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from relay.application.ports import EventPublisher


@asynccontextmanager
async def open_publisher(
    settings: tuple[BrokerSettings, RedisSettings],
    stream: str,
    *,
    create: bool,
    dedup_window_ns: int = DEFAULT_DEDUP_WINDOW_NS,
) -> AsyncIterator[tuple[EventPublisher, Redis | None]]:
    """The publisher of ``stream`` on the selected broker, and the Redis client
    behind it (``None`` on the embedded broker) for the callers' notes.
    ``create``: the embedded broker file may be made (``relay publish``);
    ``dedup_window_ns``: ``PUBLISH_DEDUP_WINDOW``."""
    broker, redis_settings = settings
    if broker.embedded:
        from relay.adapters.sqlite.broker.producer import SqliteEventPublisher

        async with open_store(broker, create=create) as store:
            yield SqliteEventPublisher(store, stream, dedup_window_ns=dedup_window_ns), None
        return
    from relay.adapters.redis.connection import connect_redis
    from relay.adapters.redis.producer import RedisEventPublisher

    client = await connect_redis(redis_settings.url)
    try:
        yield RedisEventPublisher(client, stream, dedup_window_ns=dedup_window_ns), client
    finally:
        await client.aclose()


def driver_error(exc: BaseException) -> bool:
    """A Redis driver or socket error (imported only once one happened)."""
    if isinstance(exc, OSError):
        return True
    from redis.exceptions import RedisError

    return isinstance(exc, RedisError)
