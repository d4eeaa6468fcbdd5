"""Persistent services against the real engine: the reconciler with the real image
builder, the Docker service adapters and the SQLite state view.

Replicas answer HTTP on their bridge address (no host port is ever published);
a killed replica comes back on the next pass; an ``env`` change and a secret
rotation replace every replica with one always running; a failing build keeps
the old replica serving and ``inspect`` says why.
"""

from __future__ import annotations

import io
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiodocker
import aiohttp
import anyio
import pytest
import structlog
import structlog.testing

from relay.adapters.docker.images import DockerImageBuilder
from relay.adapters.docker.runtime import DockerContainerRuntime
from relay.adapters.docker.services import DockerServiceContainers, DockerServiceImages
from relay.adapters.fs.discovery import FsFunctionSource
from relay.adapters.sqlite.db import db_path, open_db
from relay.adapters.sqlite.state_view import SqliteStateView
from relay.adapters.system import SystemClock
from relay.application.bus import MessageBus
from relay.application.concurrency import Slots
from relay.application.reconcile import FAILED, PREPARED, UNCHANGED, Reconciler
from relay.application.registry import FunctionRegistry
from relay.application.services import ServiceConverger
from relay.domain.commands import ReconcileFunction
from relay.domain.services import RoutingSettings
from relay.entrypoints.cli.fn_catalog import render_inspect
from tests.fakes import InMemorySecretStore
from tests.fakes_compose import reconciler_on
from tests.integration.runtime_support import poll, remove_worker_containers
from tests.testbed import DockerCleanup

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

NODE_TEMPLATE = """\
runtime: node24
env:
  MODE: {mode}
secrets:
  TOKEN: api-token
services:
  - entrypoint: service.js
    port: 3000
    replicas: {replicas}
"""
SERVICE_JS = """\
import http from "node:http";
http.createServer((req, res) => {
  res.end(JSON.stringify({mode: process.env.MODE, token: process.env.TOKEN.length,
    port: process.env.PORT, uid: process.getuid()}));
}).listen(Number(process.env.PORT));
"""
BUILD_TEMPLATE = """\
services:
  - build: Dockerfile
    port: 8080
"""
DOCKERFILE = """\
FROM python:3.14-slim
{extra}
CMD ["sh", "-c", "exec python3 -m http.server $PORT"]
"""


@dataclass
class Bed:
    name: str
    directory: Path
    state_dir: Path
    reconciler: Reconciler
    secrets: InMemorySecretStore
    docker: aiodocker.Docker
    containers: DockerServiceContainers
    bus: MessageBus

    def write_node(self, *, mode: str = "a", replicas: int = 2) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "service.js").write_text(SERVICE_JS)
        template = NODE_TEMPLATE.format(mode=mode, replicas=replicas)
        (self.directory / "template.yaml").write_text(template)

    async def reconcile(self) -> str:
        result: str = await self.bus.send(ReconcileFunction(name=self.name))
        return result

    async def running(self) -> list[Any]:
        found = []
        for replica in await self.containers.observe(self.name):
            if replica.running:
                found.append(await self.docker.containers.get(replica.id))
        return found

    async def get(self, container: Any, path: str = "/") -> tuple[int, str]:
        info = await container.show()
        address = info["NetworkSettings"]["IPAddress"]
        port = info["Config"]["Labels"]["relay.port"]
        timeout = aiohttp.ClientTimeout(total=2)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(f"http://{address}:{port}{path}") as response,
        ):
            return response.status, await response.text()

    async def answers(self, container: Any) -> bool:
        try:
            status, _ = await self.get(container)
        except (aiohttp.ClientError, TimeoutError):
            return False
        return status == 200

    def inspect(self) -> list[str]:
        db = open_db(db_path(self.state_dir))
        try:
            found = db.row("functions", self.name)
        finally:
            db.close()
        assert found is not None
        return render_inspect(found[0], {}, None, time.time())


@pytest.fixture
async def bed(tmp_path: Path, unique: str, docker_cleanup: DockerCleanup) -> AsyncIterator[Bed]:
    functions = tmp_path / "functions"
    state_dir = tmp_path / "state"
    secrets = InMemorySecretStore({"api-token": "first-secret"})
    clock = SystemClock()
    async with aiodocker.Docker() as docker:
        containers = DockerServiceContainers(docker, hostname=unique)
        try:
            async with DockerContainerRuntime(docker, hostname=unique) as runtime:
                view = SqliteStateView(db_path(state_dir))
                await view.open()
                bus = MessageBus({})
                view.subscribe(bus)
                services = ServiceConverger(
                    images=DockerServiceImages(docker, labels=docker_cleanup.labels),
                    containers=containers,
                    secrets=secrets,
                    routing=RoutingSettings(),
                    hostname=unique,
                    env_key=b"k" * 32,
                    clock=clock,
                )
                reconciler = reconciler_on(
                    bus,
                    registry=FunctionRegistry(),
                    source=FsFunctionSource(functions),
                    builder=DockerImageBuilder(docker, labels=docker_cleanup.labels),
                    runtime=runtime,
                    slots=Slots(max_concurrency=8),
                    clock=clock,
                    services=services,
                )
                yield Bed(
                    unique,
                    functions / unique,
                    state_dir,
                    reconciler,
                    secrets,
                    docker,
                    containers,
                    bus,
                )
                await view.aclose()
        finally:
            for replica in await containers.observe():
                await containers.remove(replica.id)
            await remove_worker_containers(docker, unique)


async def test_replicas_answer_hardened_with_no_host_port(bed: Bed) -> None:
    bed.write_node()
    assert await bed.reconcile() == PREPARED
    running = await bed.running()
    assert len(running) == 2
    for container in running:
        await poll(partial(bed.answers, container), what="the replica answering")
        _, body = await bed.get(container)
        assert body == '{"mode":"a","token":12,"port":"3000","uid":10001}'
        info = await container.show()
        host = info["HostConfig"]
        assert host["ReadonlyRootfs"] is True
        assert host["CapDrop"] == ["ALL"]
        assert host["PortBindings"] in (None, {})
        assert "first-secret" not in str(info["Config"]["Labels"])
    lines = bed.inspect()
    assert "  service.js  port=3000 replicas=2" in lines
    assert "    replicas: running running" in lines


async def test_a_killed_replica_is_recreated_within_one_pass(bed: Bed) -> None:
    bed.write_node(replicas=1)
    await bed.reconcile()
    (victim,) = await bed.running()
    await victim.kill()
    await poll(lambda: _exited(victim), what="the killed replica to stop")
    await bed.reconcile()
    (healed,) = await bed.running()
    assert healed.id != victim.id
    await poll(lambda: bed.answers(healed), what="the recreated replica answering")


async def _exited(container: Any) -> bool:
    info = await container.show()
    return not info["State"]["Running"]


@pytest.mark.parametrize("change", ["env", "secret"])
async def test_env_change_and_secret_rotation_replace_with_one_always_running(
    bed: Bed, change: str
) -> None:
    bed.write_node(replicas=1)
    await bed.reconcile()
    (old,) = await bed.running()
    if change == "env":
        bed.write_node(mode="b", replicas=1)
    else:
        bed.secrets.set("api-token", "the-rotated-secret")
    counts: list[int] = []
    done = anyio.Event()

    async def watch() -> None:
        while not done.is_set():
            counts.append(len(await bed.running()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await bed.reconcile()
        done.set()
    (new,) = await bed.running()
    assert new.id != old.id
    assert counts
    assert min(counts) >= 1, counts
    await poll(lambda: bed.answers(new), what="the replacement answering")
    _, body = await bed.get(new)
    assert ('"mode":"b"' in body) if change == "env" else ('"token":18' in body)


async def test_a_failing_build_keeps_the_old_replica_serving_and_inspect_says_why(
    bed: Bed,
) -> None:
    bed.directory.mkdir(parents=True)
    (bed.directory / "template.yaml").write_text(BUILD_TEMPLATE)
    (bed.directory / "Dockerfile").write_text(DOCKERFILE.format(extra=""))
    assert await bed.reconcile() == PREPARED
    (old,) = await bed.running()
    await poll(lambda: bed.answers(old), what="the built service answering")
    info = await old.show()
    assert info["Config"]["Labels"]["relay.image"].startswith(f"relay-fn-{bed.name}:")

    (bed.directory / "Dockerfile").write_text(DOCKERFILE.format(extra="RUN exit 3"))
    assert await bed.reconcile() == FAILED
    (still,) = await bed.running()
    assert still.id == old.id
    assert await bed.answers(still)
    # retirement ran after this pass and kept the image the old replica runs
    await bed.docker.images.inspect(info["Config"]["Labels"]["relay.image"])
    lines = bed.inspect()
    assert any(line.startswith("Last reconcile:  failed") for line in lines), lines
    error = next(line for line in lines if line.startswith("Last error:"))
    assert 'service "Dockerfile": build of Dockerfile failed' in error


async def test_a_missing_external_image_is_reported_and_nothing_starts(bed: Bed) -> None:
    bed.directory.mkdir(parents=True)
    missing = f"relay-test-missing/{bed.name}:1"
    (bed.directory / "template.yaml").write_text(f"services:\n  - image: {missing}\n")
    assert await bed.reconcile() == FAILED
    assert await bed.running() == []
    error = next(line for line in bed.inspect() if line.startswith("Last error:"))
    assert f'service "{missing}": image {missing} is not available locally' in error


async def test_a_failed_pull_of_a_local_image_keeps_serving_and_is_retried(
    bed: Bed, docker_cleanup: DockerCleanup
) -> None:
    local = docker_cleanup.image(f"relay-test-local/{bed.name}:1")
    recipe = DOCKERFILE.format(extra="").encode()
    await anyio.to_thread.run_sync(
        lambda: docker_cleanup.client.images.build(
            fileobj=io.BytesIO(recipe), tag=local, labels=docker_cleanup.labels, rm=True
        )
    )
    bed.directory.mkdir(parents=True)
    template = f"services:\n  - image: {local}\n    port: 8080\n"
    (bed.directory / "template.yaml").write_text(template)
    with structlog.testing.capture_logs() as logs:
        assert await bed.reconcile() == PREPARED
        (replica,) = await bed.running()
        await poll(lambda: bed.answers(replica), what="the external image answering")
        assert await bed.reconcile() == UNCHANGED
    checks = [e for e in logs if e["event"] == "service_image_check_failed"]
    # no registry answers here: each pass checks again (a failure never opens the window)
    assert len(checks) == 2
    (same,) = await bed.running()
    assert same.id == replica.id


async def test_an_ignored_entrypoint_is_reported_and_nothing_starts(bed: Bed) -> None:
    bed.write_node(replicas=1)
    (bed.directory / ".gitignore").write_text("service.js\n")
    assert await bed.reconcile() == FAILED
    assert await bed.running() == []
    error = next(line for line in bed.inspect() if line.startswith("Last error:"))
    assert 'service "service.js": entrypoint service.js is not in the function\'s source' in error
