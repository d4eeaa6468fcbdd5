"""``relay health``: ping Redis and Docker for real; never starts anything."""

from __future__ import annotations

from collections.abc import Mapping

from relay.adapters.docker.connection import connect_docker
from relay.adapters.redis.connection import connect_redis
from relay.domain.errors import RelayError
from relay.entrypoints.config import parse_redis_uri


async def check_health(env: Mapping[str, str]) -> str | None:
    """Return ``None`` when healthy, else the first failing check as one line."""
    uri = env.get("REDIS_URI", "").strip()
    if not uri:
        return "REDIS_URI is required: host:port, redis://[user:password@]host:port or rediss://..."
    try:
        url = parse_redis_uri(uri)
    except ValueError:
        return f"REDIS_URI={uri!r} is invalid: host:port, redis://... or rediss://..."
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
