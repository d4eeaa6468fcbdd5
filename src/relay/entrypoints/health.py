"""``relay health``: ping the broker and Docker for real; never starts anything.

The broker is Redis (a PING) or, with ``RELAY_BROKER=sqlite``, the embedded
broker file (it must exist and pass ``PRAGMA quick_check``).
"""

from __future__ import annotations

from collections.abc import Mapping

from relay.adapters.admin import check_broker
from relay.adapters.docker.connection import connect_docker
from relay.domain.errors import ConfigError, RelayError
from relay.entrypoints.config import load_broker_settings


async def check_health(env: Mapping[str, str]) -> str | None:
    """Return ``None`` when healthy, else the first failing check as one line."""
    try:
        broker, redis = load_broker_settings(env, need_stream=False, need_group=False)
    except ConfigError as exc:
        return str(exc)
    try:
        await check_broker(broker, redis)
    except RelayError as exc:
        return str(exc)
    try:
        docker = await connect_docker()
    except RelayError as exc:
        return str(exc)
    await docker.close()
    return None

