"""Startup checks: NETWORKS must exist (and containers join them), orphan sweep."""

from __future__ import annotations

import aiodocker
import pytest

from relay.adapters.docker.runtime import sweep_orphans, verify_networks
from relay.domain.errors import ConfigError
from tests.integration.runtime_support import (
    assert_ok,
    built_image,
    request,
    runtime_for,
    worker_containers,
)
from tests.shared_run import SharedImages
from tests.testbed import DockerCleanup, DockerEngine

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

PY = "python3.14"


@pytest.fixture(scope="module")
def image(docker_engine: DockerEngine, shared_images: SharedImages) -> str:
    return built_image(shared_images, PY)


async def test_missing_network_fails_naming_it(unique: str) -> None:
    async with aiodocker.Docker() as docker:
        await verify_networks(docker, ["bridge"])
        with pytest.raises(ConfigError, match=f"no-such-net-{unique}"):
            await verify_networks(docker, ["bridge", f"no-such-net-{unique}"])


async def test_containers_join_every_configured_network(
    image: str, unique: str, docker_cleanup: DockerCleanup, docker_engine: DockerEngine
) -> None:
    names = [f"{unique}-backend", f"{unique}-monitoring"]
    for name in names:
        docker_engine.client.networks.create(name, labels=docker_cleanup.labels)
        docker_cleanup.network(name)
    async with runtime_for(f"w-{unique}", networks=tuple(names)) as (runtime, _, docker):
        await verify_networks(docker, names)
        runtime.activate("net-fn", image, PY, 1)
        assert_ok(await runtime.invoke(request("net-fn", "probe.hello")))
        (container,) = await worker_containers(docker, f"w-{unique}")
        info = docker_engine.client.api.inspect_container(container.id)
        assert set(info["NetworkSettings"]["Networks"]) == set(names)


async def test_sweep_removes_only_this_workers_stale_containers(
    image: str, unique: str, docker_cleanup: DockerCleanup, docker_engine: DockerEngine
) -> None:
    client = docker_engine.client
    mine = f"w-{unique}"

    def stale(hostname: str, kind: str = "execution") -> str:
        labels = {
            **docker_cleanup.labels,
            "relay.type": kind,
            "relay.hostname": hostname,
            "relay.function": "f",
        }
        container = client.containers.run(
            image, ["sleep", "600"], detach=True, labels=labels, name=f"{unique}-{kind}-{hostname}"
        )
        return str(container.id)

    own = stale(mine)
    other_worker = stale(f"other-{unique}")
    not_execution = stale(mine, kind="service")
    unlabelled = client.containers.run(
        image, ["sleep", "600"], detach=True, labels=docker_cleanup.labels, name=f"{unique}-plain"
    ).id
    async with aiodocker.Docker() as docker:
        assert await sweep_orphans(docker, mine) == 1
    remaining = {c.id for c in client.containers.list(all=True, filters={"name": unique})}
    assert own not in remaining
    assert {other_worker, not_execution, unlabelled} <= remaining
