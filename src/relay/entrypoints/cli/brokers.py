"""Which broker an admin command talks to, from the environment.

``RELAY_BROKER=sqlite`` opens the embedded broker file (``RELAY_BROKER_PATH``);
otherwise Redis (``REDIS_URI``, ``REDIS_STREAM``), exactly as before.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio
from redis.asyncio import Redis

from relay.adapters.redis.dlq_reader import RedisDeadLetterReader
from relay.adapters.sqlite.broker.dlq import SqliteDeadLetterReader
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock
from relay.domain.errors import DependencyUnavailable, RelayError
from relay.entrypoints.cli.common import fail
from relay.entrypoints.config import BrokerSettings, RedisSettings, load_broker_settings

T = TypeVar("T")
DeadLetters = RedisDeadLetterReader | SqliteDeadLetterReader


def broker_settings(*, need_group: bool = False) -> tuple[BrokerSettings, RedisSettings]:
    """The broker and stream settings, or one line and exit 1."""
    try:
        return load_broker_settings(os.environ, need_group=need_group)
    except RelayError as exc:
        fail("; ".join(str(exc).splitlines()))


@asynccontextmanager
async def open_store(broker: BrokerSettings, *, create: bool) -> AsyncIterator[BrokerStore]:
    """The broker file, opened (and checked) in a worker thread; closed after."""
    if not create and not broker.path.exists():
        raise DependencyUnavailable(
            f"broker file {broker.path} does not exist (RELAY_BROKER_PATH names it;"
            " relay start or relay publish creates it)"
        )
    store = await anyio.to_thread.run_sync(BrokerStore, broker.path, SystemClock())
    try:
        yield store
    finally:
        await anyio.to_thread.run_sync(store.close)


def with_dead_letters(
    settings: tuple[BrokerSettings, RedisSettings],
    action: Callable[[DeadLetters], Awaitable[T]],
) -> T:
    """Run ``action(reader)`` with the selected broker's dead-letter reader."""
    broker, redis_settings = settings

    async def run() -> T:
        if broker.embedded:
            async with open_store(broker, create=False) as store:
                return await action(SqliteDeadLetterReader(store))
        redis = Redis.from_url(redis_settings.url, socket_connect_timeout=5, socket_timeout=10)
        try:
            return await action(RedisDeadLetterReader(redis, redis_settings.stream))
        finally:
            await redis.aclose()

    try:
        return anyio.run(run)
    except RelayError as exc:
        fail(str(exc))
