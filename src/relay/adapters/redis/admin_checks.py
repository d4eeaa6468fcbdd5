"""Whether the configured stream and group exist on Redis, for the admin commands.

A read command pointed at a stream or group that does not exist would otherwise
print an empty answer ("no dead letters", "not pending") that looks like good news.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from relay.domain.errors import DependencyUnavailable


def admin_redis_client(url: str) -> Redis:
    """The admin commands' Redis client: short timeouts, one command at a time."""
    return Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)


async def redis_target_problem(redis: Redis, stream: str, group: str | None) -> str | None:
    """Why ``stream`` (and ``group``, when given) cannot be read on this server, or
    ``None`` when both exist. One line naming the variable to fix; never the URL."""
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


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
