"""``relay health``: ping the broker and Docker for real; never starts anything.

The broker is Redis (a PING) or, with ``RELAY_BROKER=sqlite``, the embedded
broker file (it must exist and pass ``PRAGMA quick_check``).
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio

from relay.adapters.docker.connection import connect_docker
from relay.adapters.redis.connection import connect_redis
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock
from relay.domain.errors import ConfigError, RelayError
from relay.entrypoints.config import BrokerSettings, load_broker_settings


async def check_health(env: Mapping[str, str]) -> str | None:
    """Return ``None`` when healthy, else the first failing check as one line."""
    try:
        broker, redis = load_broker_settings(env, need_stream=False, need_group=False)
    except ConfigError as exc:
        return str(exc)
    try:
        if broker.embedded:
            await _check_file(broker)
        else:
            client = await connect_redis(redis.url)
            await client.aclose()
    except RelayError as exc:
        return str(exc)
    try:
        docker = await connect_docker()
    except RelayError as exc:
        return str(exc)
    await docker.close()
    return None


async def _check_file(broker: BrokerSettings) -> None:
    if not broker.path.exists():
        raise ConfigError(f"broker file {broker.path} does not exist (is a worker running here?)")
    store = await anyio.to_thread.run_sync(BrokerStore, broker.path, SystemClock())
    await anyio.to_thread.run_sync(store.close)
