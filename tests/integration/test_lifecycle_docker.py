"""The function lifecycle against the real engine: the reconciler with the real
image builder and warm container runtime, and the SQLite state view.

A broken edit keeps the old version serving and ``inspect`` shows the failure;
removing a function lets its in-flight invocation finish, then removes its image.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiodocker
import anyio
import pytest

from relay.adapters.docker.images import DockerImageBuilder
from relay.adapters.docker.runtime import DockerContainerRuntime
from relay.adapters.fs.discovery import FsFunctionSource
from relay.adapters.sqlite.db import db_path, open_db
from relay.adapters.sqlite.state_view import SqliteStateView
from relay.adapters.system import SystemClock
from relay.application.bus import MessageBus
from relay.application.concurrency import Slots
from relay.application.reconcile import FAILED, PREPARED, REMOVED, Reconciler
from relay.application.registry import FunctionRegistry
from relay.domain.commands import ReconcileAll, ReconcileFunction
from relay.entrypoints.cli.fn_catalog import render_inspect
from tests.fakes_compose import reconciler_on
from tests.integration.runtime_support import Captured, poll, remove_worker_containers, request
from tests.testbed import DockerCleanup

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

TEMPLATE = """\
runtime: python3.14
events:
  - handler: main.handler
    pattern:
      event_name: [INSERT]
"""
HANDLER = """\
import time

def handler(event):
    if event.get("slow"):
        time.sleep(float(event["slow"]))
    print("VERSION {version}")
"""


@dataclass
class Lifecycle:
    name: str
    directory: Path
    state_dir: Path
    reconciler: Reconciler
    runtime: DockerContainerRuntime
    captured: Captured
    docker: aiodocker.Docker
    bus: MessageBus

    async def reconcile(self, name: str) -> str:
        result: str = await self.bus.send(ReconcileFunction(name=name))
        return result

    def write(self, version: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "template.yaml").write_text(TEMPLATE)
        (self.directory / "main.py").write_text(HANDLER.format(version=version))

    async def invoke(self, **event: object) -> None:
        result = await self.runtime.invoke(request(self.name, "main.handler", event))
        assert result.ok, result.error

    def versions(self) -> list[str]:
        return [line.rsplit("VERSION ", 1)[1] for line in self.captured.lines if "VERSION " in line]

    async def image_exists(self, tag: str) -> bool:
        try:
            await self.docker.images.inspect(tag)
        except aiodocker.DockerError:
            return False
        return True

    def busy(self) -> int:
        snapshot = self.runtime.snapshot(self.name)
        return snapshot.busy if snapshot is not None else 0

    def inspect(self) -> list[str]:
        db = open_db(db_path(self.state_dir))
        try:
            found = db.row("functions", self.name)
        finally:
            db.close()
        assert found is not None
        return render_inspect(found[0], {}, None, time.time())


@pytest.fixture
async def lifecycle(
    tmp_path: Path, unique: str, docker_cleanup: DockerCleanup
) -> AsyncIterator[Lifecycle]:
    functions = tmp_path / "functions"
    state_dir = tmp_path / "state"
    captured = Captured()
    async with aiodocker.Docker() as docker:
        try:
            async with DockerContainerRuntime(
                docker, hostname=unique, output=captured.lines.append
            ) as runtime:
                view = SqliteStateView(db_path(state_dir))
                await view.open()
                bus = MessageBus({})
                view.subscribe(bus)
                reconciler = reconciler_on(
                    bus,
                    registry=FunctionRegistry(),
                    source=FsFunctionSource(functions),
                    builder=DockerImageBuilder(docker, labels=docker_cleanup.labels),
                    runtime=runtime,
                    slots=Slots(max_concurrency=8),
                    clock=SystemClock(),
                )
                yield Lifecycle(
                    unique, functions / unique, state_dir, reconciler, runtime, captured, docker,
                    bus,
                )
                await view.aclose()
        finally:
            await remove_worker_containers(docker, unique)


async def test_a_broken_edit_keeps_the_old_version_serving(lifecycle: Lifecycle) -> None:
    lifecycle.write("one")
    assert await lifecycle.reconcile(lifecycle.name) == PREPARED
    await lifecycle.invoke()
    assert lifecycle.versions() == ["one"]
    first = lifecycle.reconciler.registry.get(lifecycle.name)
    assert first is not None

    lifecycle.write("two")
    (lifecycle.directory / "requirements.txt").write_text("this is == not a requirement\n")
    assert await lifecycle.reconcile(lifecycle.name) == FAILED

    assert lifecycle.reconciler.registry.get(lifecycle.name) == first
    await lifecycle.invoke()
    assert lifecycle.versions() == ["one", "one"]  # the old version still serves
    lines = lifecycle.inspect()
    assert "Status:          ready" in lines
    assert any(line.startswith("Last reconcile:  failed (") for line in lines)
    assert any(line.startswith("Last error:      ") for line in lines)
    assert f"Image:           {first.image}" in lines

    (lifecycle.directory / "requirements.txt").unlink()
    assert await lifecycle.reconcile(lifecycle.name) == PREPARED
    await lifecycle.invoke()
    assert lifecycle.versions()[-1] == "two"
    assert any(line.startswith("Last reconcile:  success (") for line in lifecycle.inspect())


async def test_removal_drains_in_flight_work_then_removes_the_image(
    lifecycle: Lifecycle,
) -> None:
    lifecycle.write("one")
    assert await lifecycle.reconcile(lifecycle.name) == PREPARED
    active = lifecycle.reconciler.registry.get(lifecycle.name)
    assert active is not None
    assert active.image is not None
    image = active.image

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: lifecycle.invoke(slow="2"))
        await poll(lambda: lifecycle.busy() == 1, what="busy")
        for path in lifecycle.directory.iterdir():
            path.unlink()
        lifecycle.directory.rmdir()
        assert await lifecycle.reconcile(lifecycle.name) == REMOVED
        assert lifecycle.reconciler.registry.get(lifecycle.name) is None
        assert await lifecycle.image_exists(image)  # in use by the busy container
    assert lifecycle.versions() == ["one"]  # the in-flight invocation finished

    async def gone() -> bool:
        await lifecycle.bus.send(ReconcileAll())  # the periodic pass retries the retire
        return not await lifecycle.image_exists(image)

    await poll(gone, timeout_s=30, what="image removed")
    await poll(lambda: lifecycle.runtime.snapshot(lifecycle.name) is None, what="pool gone")
