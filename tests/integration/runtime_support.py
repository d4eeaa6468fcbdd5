"""Shared pieces of the runtime integration tests: test images with the real
bootstraps, a runtime bound to a unique worker hostname, and polling helpers."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiodocker
import anyio
import pytest

from relay.adapters.docker.bootstraps import bootstrap_source
from relay.adapters.docker.runtime import DockerContainerRuntime
from relay.domain.execution import InvocationRequest, InvocationResult
from relay.domain.messages import DomainEvent
from tests.shared_run import SharedImages
from tests.testbed import TEST_LABEL

APP_DIR = Path(__file__).parent / "runtime_app"

# Runs a test both ways a request can reach the bootstrap: over Relay's socket
# (the worker's default with a local engine) and over the attach stream.
BOTH_WAYS = pytest.mark.parametrize(
    "direct", [pytest.param(True, id="socket"), pytest.param(False, id="attach")]
)
BASES = {"python3.14": ("python:3.14-slim", "python"), "node24": ("node:24-alpine", "node")}


def built_image(images: SharedImages, runtime: str, extra: str = "") -> str:
    """A test image FROM the runtime's base with the bootstrap and the probe app.

    Labelled ``relay.test=true``; built once per test run whichever worker asks first
    (the same recipe gives the same tag) and removed when the whole run is over."""
    base, app = BASES[runtime]
    path, source = bootstrap_source(runtime)
    with tempfile.TemporaryDirectory() as context:
        root = Path(context)
        shutil.copytree(APP_DIR / app, root / "app")
        (root / "bootstrap").write_bytes(source)
        (root / "Dockerfile").write_text(
            f"FROM {base}\nCOPY bootstrap {path}\nCOPY app /app\nWORKDIR /app\n"
            f"LABEL {TEST_LABEL}=true\n{extra}\n"
        )
        return images.build(f"relay-test-runtime-{runtime.replace('.', '')}", root)


class Captured:
    """Output lines and domain events a runtime produced."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.events: list[DomainEvent] = []

    def tagged(self, tag: str) -> list[dict[str, Any]]:
        """JSON payloads of output lines whose text starts with ``TAG ``."""
        found = []
        for line in self.lines:
            _, _, text = line.partition('": ')
            if text.startswith(tag + " "):
                found.append(json.loads(text[len(tag) + 1 :]))
        return found


@asynccontextmanager
async def runtime_for(
    hostname: str,
    *,
    networks: tuple[str, ...] = (),
    idle_timeout_s: float = 300.0,
    max_containers: int | None = None,
    direct: bool = True,
) -> AsyncIterator[tuple[DockerContainerRuntime, Captured, aiodocker.Docker]]:
    """A runtime as the worker makes one: with Relay's socket mounted into each
    container (``direct``, as with a local engine), or requests on the attach stream."""
    docker = aiodocker.Docker()
    captured = Captured()
    run_dir = Path(tempfile.mkdtemp(prefix="relay-direct-"))
    try:
        async with DockerContainerRuntime(
            docker,
            hostname=hostname,
            networks=networks,
            idle_timeout_s=idle_timeout_s,
            output=captured.lines.append,
            observer=captured.events.append,
            max_containers=max_containers,
            direct_dir=run_dir / "containers" if direct else None,
        ) as runtime:
            yield runtime, captured, docker
    finally:
        await remove_worker_containers(docker, hostname)
        await docker.close()
        shutil.rmtree(run_dir, ignore_errors=True)


async def worker_containers(
    docker: aiodocker.Docker, hostname: str, function: str | None = None
) -> list[Any]:
    labels = [f"relay.hostname={hostname}"]
    if function:
        labels.append(f"relay.function={function}")
    return list(await docker.containers.list(filters=json.dumps({"label": labels})))


async def remove_worker_containers(docker: aiodocker.Docker, hostname: str) -> None:
    for container in await worker_containers(docker, hostname):
        with suppress(aiodocker.DockerError):
            await container.delete(force=True)


def request(
    function: str, handler: str, event: dict[str, Any] | None = None, **kw: Any
) -> InvocationRequest:
    return InvocationRequest(
        function=function,
        handler=handler,
        event=json.dumps(event or {}).encode(),
        **kw,
    )


async def poll(condition: Callable[[], Any], timeout_s: float = 20.0, what: str = "") -> None:
    """Await ``condition()`` (sync or async) becoming truthy, with a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if hasattr(value, "__await__"):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await anyio.sleep(0.05)


def assert_ok(result: InvocationResult) -> None:
    assert result.ok, result.error
