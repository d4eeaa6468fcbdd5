"""Which broker an admin command talks to, from the environment.

``RELAY_BROKER=sqlite`` opens the embedded broker file (``RELAY_BROKER_PATH``);
otherwise Redis (``REDIS_URI``, ``REDIS_STREAM``), exactly as before. The Redis
client and the broker are imported inside the functions that use them: every
admin command imports this module, and each needs one broker at most.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import anyio

from relay.domain.errors import DependencyUnavailable, RelayError
from relay.entrypoints.cli.common import fail
from relay.entrypoints.config import BrokerSettings, RedisSettings, load_broker_settings

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from relay.adapters.redis.dlq_reader import RedisDeadLetterReader
    from relay.adapters.sqlite.broker.dlq import SqliteDeadLetterReader
    from relay.adapters.sqlite.broker.store import BrokerStore

T = TypeVar("T")
DeadLetters: TypeAlias = "RedisDeadLetterReader | SqliteDeadLetterReader"


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
    from relay.adapters.sqlite.broker.store import BrokerStore
    from relay.adapters.system import SystemClock

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
            from relay.adapters.sqlite.broker.dlq import SqliteDeadLetterReader

            async with open_store(broker, create=False) as store:
                return await action(SqliteDeadLetterReader(store))
        from relay.adapters.redis.dlq_reader import RedisDeadLetterReader

        redis = redis_client(redis_settings.url)
        try:
            return await action(RedisDeadLetterReader(redis, redis_settings.stream))
        finally:
            await redis.aclose()

    try:
        return anyio.run(run)
    except RelayError as exc:
        fail(str(exc))


# --- the configured stream and group must exist -------------------------------------
# A read command pointed at a stream or group that does not exist would otherwise
# print an empty answer ("no dead letters", "not pending") that looks like good news.


async def redis_target_problem(redis: Redis, stream: str, group: str | None) -> str | None:
    """Why ``stream`` (and ``group``, when given) cannot be read on this server, or
    ``None`` when both exist. One line naming the variable to fix; never the URL."""
    from redis.exceptions import RedisError, ResponseError

    try:
        groups: Any = await redis.xinfo_groups(stream)
    except ResponseError as exc:
        if "no such key" in str(exc).lower():
            return f"stream {stream!r} does not exist (REDIS_STREAM names it)"
        if "wrongtype" in str(exc).lower():
            return f"key {stream!r} is not a stream (REDIS_STREAM names it)"
        raise DependencyUnavailable(f"cannot read stream {stream!r}: {exc}") from exc
    except (RedisError, OSError) as exc:
        raise DependencyUnavailable(f"cannot read from Redis: {exc}") from exc
    if group is None:
        return None
    names = sorted(_text(g.get("name", "")) for g in groups)
    if group in names:
        return None
    known = f"its groups: {', '.join(names)}" if names else "it has no consumer groups"
    return f"group {group!r} does not exist on stream {stream!r} (REDIS_GROUP names it; {known})"


async def unread_stream_note(redis: Redis, stream: str, group: str) -> str | None:
    """After ``relay publish`` on Redis: one line when no consumer group reads
    ``stream`` yet (``group``, the configured ``REDIS_GROUP``, or any when unset).
    The events are kept: the worker creates its group from the stream's start."""
    from redis.exceptions import ResponseError

    try:
        groups: Any = await redis.xinfo_groups(stream)
    except ResponseError:  # the stream went meanwhile: nothing to say about groups
        return None
    names = {_text(g.get("name", "")) for g in groups}
    if group and group not in names:
        return (
            f"no consumer group {group!r} reads stream {stream!r} yet (REDIS_GROUP names it);"
            " the events wait there until a worker creates it"
        )
    if not group and not names:
        return (
            f"no consumer group reads stream {stream!r} yet;"
            " the events wait there until a worker creates one"
        )
    return None


async def sqlite_target_problem(store: BrokerStore, stream: str) -> str | None:
    """The embedded broker has one group per file, so only the stream can be wrong:
    a file that holds jobs or dead letters of other streams only."""

    def streams(c: sqlite3.Connection) -> list[str]:
        # the usual answer (the stream is there) is one index lookup; the list of
        # what the file holds is only read for the error line
        if c.execute("SELECT 1 FROM jobs WHERE stream = ? LIMIT 1", (stream,)).fetchone():
            return []
        rows = c.execute(
            "SELECT stream FROM jobs UNION SELECT original_stream FROM dlq ORDER BY 1 LIMIT 20"
        ).fetchall()
        return [str(r[0]) for r in rows]

    found = await store.read(streams)
    if not found or stream in found:
        return None
    return (
        f"stream {stream!r} has no entries in the broker file {store.path} "
        f"(REDIS_STREAM names it; the file holds: {', '.join(found)})"
    )


def require_stream(
    settings: tuple[BrokerSettings, RedisSettings], *, group: bool = False
) -> None:
    """Exit 1 with one line unless the configured stream (and, with ``group``, the
    consumer group) exists on the selected broker. ``relay trace`` and
    ``relay dlq ls`` call this before answering, so a typo in ``REDIS_STREAM`` or
    ``REDIS_GROUP`` is an error, never an empty answer."""
    broker, redis_settings = settings

    async def run() -> str | None:
        if broker.embedded:
            async with open_store(broker, create=False) as store:
                return await sqlite_target_problem(store, redis_settings.stream)
        redis = redis_client(redis_settings.url)
        try:
            return await redis_target_problem(
                redis, redis_settings.stream, redis_settings.group if group else None
            )
        finally:
            await redis.aclose()

    try:
        problem = anyio.run(run)
    except RelayError as exc:
        fail(str(exc))
    if problem is not None:
        fail(problem)


def redis_client(url: str) -> Redis:
    """The admin commands' Redis client: short timeouts, one command at a time."""
    from redis.asyncio import Redis

    return Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
