"""Opening a Redis connection and translating driver errors into one clear line."""

from __future__ import annotations

from urllib.parse import urlsplit

import anyio
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from relay.domain.errors import DependencyUnavailable

CONNECT_TIMEOUT_S = 5.0


def describe(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}"


def redis_client(url: str) -> aioredis.Redis:
    """A client with bounded connect time; commands that block (XREADGROUP) set their own.

    A command that meets a connection the server closed (a pooled connection after
    a Redis restart) is sent once more on a fresh connection; a server that is down
    still fails at once (the reconnect is refused). Re-sending is safe for what
    Relay sends, even when the lost reply is that of a command the server ran:
    every ledger script is fenced by its token (a re-run begin finds its own
    claim, a re-run finish is rejected and settles the same way), XACK and XDEL
    change nothing twice, and a re-sent XREADGROUP or XAUTOCLAIM at worst leaves
    what the first call took pending for the next recovery pass (at-least-once).
    Timeouts are not retried.
    """
    return aioredis.Redis.from_url(
        url, socket_connect_timeout=CONNECT_TIMEOUT_S, health_check_interval=30,
        decode_responses=False,
        retry=Retry(NoBackoff(), 1), retry_on_error=[RedisConnectionError],
    )


async def connect_redis(url: str) -> aioredis.Redis:
    """Connect and PING, or raise :class:`DependencyUnavailable`."""
    client = redis_client(url)
    try:
        with anyio.fail_after(CONNECT_TIMEOUT_S + 1):
            await client.ping()
    except (RedisError, OSError, TimeoutError) as exc:
        await client.aclose()
        raise DependencyUnavailable(f"redis at {describe(url)} is unreachable: {exc}") from exc
    return client
