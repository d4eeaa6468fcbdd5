"""Startup checks of the Docker side: configured networks exist, and no stale
execution container of this worker survives from a previous run."""

from __future__ import annotations

import json
from collections.abc import Sequence

import aiodocker
import anyio
import structlog

from relay.adapters.docker.containers import EXECUTION_TYPE, remove_container
from relay.domain.errors import ConfigError, DependencyUnavailable

log = structlog.get_logger(__name__)

SWEEP_BUDGET_S = 30.0


async def verify_networks(docker: aiodocker.Docker, networks: Sequence[str]) -> None:
    """Every ``NETWORKS`` entry must exist; Relay never creates networks.

    Raises ``ConfigError`` naming a missing network, ``DependencyUnavailable``
    when the engine cannot answer.
    """
    for name in networks:
        try:
            await docker.networks.get(name)
        except aiodocker.DockerError as exc:
            if exc.status == 404:
                raise ConfigError(
                    f'NETWORKS: docker network "{name}" does not exist '
                    "(Relay never creates networks; create it first)"
                ) from exc
            raise DependencyUnavailable(
                f'docker could not inspect network "{name}": {exc.message}'
            ) from exc


async def sweep_orphans(
    docker: aiodocker.Docker, hostname: str, budget_s: float = SWEEP_BUDGET_S
) -> int:
    """Remove stale execution containers labelled with this worker's hostname.

    Runs at startup before any container is created, so every match is left
    over from a previous run (for example a Relay killed with SIGKILL). Other
    workers' containers and non-Relay containers are never touched. Bounded by
    ``budget_s``; returns how many were removed.
    """
    filters = {
        "label": [f"relay.type={EXECUTION_TYPE}", f"relay.hostname={hostname}"],
    }
    removed = 0
    with anyio.move_on_after(budget_s) as scope:
        try:
            stale = await docker.containers.list(all=True, filters=json.dumps(filters))
        except aiodocker.DockerError as exc:
            raise DependencyUnavailable(f"docker could not list containers: {exc.message}") from exc
        for container in stale:
            # list() already returned them (DockerContainer's public mapping access)
            labels = (container["Labels"] if "Labels" in container else None) or {}  # noqa: SIM401 - it has no get()
            mine = labels.get("relay.hostname") == hostname
            if not mine or labels.get("relay.type") != EXECUTION_TYPE:
                continue  # belt and braces: never trust a filter with someone else's container
            await remove_container(container)
            removed += 1
    if scope.cancelled_caught:
        log.warning("orphan_sweep_incomplete", removed=removed, budget_s=budget_s)
    elif removed:
        log.info("orphan_sweep_removed", removed=removed)
    return removed
