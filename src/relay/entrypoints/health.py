"""``relay health``: ping Redis and Docker for real; never starts anything."""

from __future__ import annotations

from collections.abc import Mapping

from relay.adapters.docker.connection import connect_docker
from relay.adapters.redis.connection import connect_redis
from relay.domain.errors import ConfigError, RelayError
from relay.entrypoints.config import load_redis_settings


async def check_health(env: Mapping[str, str]) -> str | None:
    """Return ``None`` when healthy, else the first failing check as one line."""
    try:
        url = load_redis_settings(env, need_stream=False, need_group=False).url
    except ConfigError as exc:
        return str(exc)
    try:
        client = await connect_redis(url)
    except RelayError as exc:
        return str(exc)
    await client.aclose()
    try:
        docker = await connect_docker()
    except RelayError as exc:
        return str(exc)
    await docker.close()
    return None
