"""Opening the Docker Engine API client (DOCKER_HOST etc. from the environment)."""

from __future__ import annotations

import aiodocker
import anyio

from relay.domain.errors import DependencyUnavailable

PING_TIMEOUT_S = 5.0


async def connect_docker() -> aiodocker.Docker:
    """Create the client and ping the engine, or raise :class:`DependencyUnavailable`."""
    try:
        docker = aiodocker.Docker()
    except Exception as exc:  # aiodocker raises plain errors for a bad DOCKER_HOST
        raise DependencyUnavailable(f"docker is unreachable: {exc}") from exc
    try:
        with anyio.fail_after(PING_TIMEOUT_S):
            # GET /version, not /info: behind a socket proxy (docs/deployment.md) the
            # allow-list grants VERSION, and /info tells far more about the host.
            await docker.version()
    except Exception as exc:  # any failure here means the engine does not answer
        await docker.close()
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DependencyUnavailable(f"docker is unreachable: {detail}") from exc
    return docker


def engine_is_local(docker: aiodocker.Docker) -> bool:
    """Whether the engine is reached through a Unix socket, so it may see
    Relay's filesystem (whether a bind mount of Relay's directory works is
    found out at the first container; see ``relay.adapters.docker.direct``)."""
    return str(docker.docker_host).startswith("unix://")
