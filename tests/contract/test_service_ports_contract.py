"""The persistent-service ports' contract (``ServiceImages``, ``ServiceContainers``),
on the in-memory fakes and on Docker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiodocker
import pytest

from relay.adapters.docker.services import DockerServiceContainers, DockerServiceImages
from relay.adapters.fs.source import read_sources, select_sources
from relay.application.ports import ServiceContainers, ServiceImages
from relay.domain.errors import RelayError
from relay.domain.services import DesiredService, ResolvedImage, RoutingSettings
from relay.domain.source import fingerprint
from relay.domain.template import ServiceSpec
from tests.fakes import InMemoryServiceContainers, InMemoryServiceImages
from tests.testbed import DockerCleanup

pytestmark = pytest.mark.anyio

BASE = "python:3.14-slim"  # a stand-in image every test bed has locally
# PID 1 ignores SIGTERM without a handler: give it one, so a stop is quick.
SERVE = (
    "python", "-c", "import signal,time; signal.signal(15, lambda *_: exit(0)); time.sleep(900)"
)


class Bed:
    images: ServiceImages
    containers: ServiceContainers
    hostname: str

    async def crash(self, container_id: str) -> None:
        raise NotImplementedError

    async def add_network(self, name: str) -> None:
        raise NotImplementedError


class MemoryBed(Bed):
    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        self.images = InMemoryServiceImages()
        self.fake = InMemoryServiceContainers(hostname)
        self.containers = self.fake

    async def crash(self, container_id: str) -> None:
        self.fake.crash(container_id)

    async def add_network(self, name: str) -> None:
        self.fake.networks.add(name)


class DockerBed(Bed):
    def __init__(self, docker: aiodocker.Docker, hostname: str, cleanup: DockerCleanup) -> None:
        self.docker = docker
        self.hostname = hostname
        self.cleanup = cleanup
        self.images = DockerServiceImages(docker, labels=cleanup.labels)
        self.containers = DockerServiceContainers(docker, hostname=hostname)

    async def crash(self, container_id: str) -> None:
        await (await self.docker.containers.get(container_id)).kill()

    async def add_network(self, name: str) -> None:
        await self.docker.networks.create({"Name": name, "Labels": self.cleanup.labels})
        self.cleanup.network(name)


@pytest.fixture(params=["memory", pytest.param("docker", marks=pytest.mark.docker)])
async def bed(request: pytest.FixtureRequest, unique: str) -> AsyncIterator[Bed]:
    hostname = f"w-{unique}"
    if request.param == "memory":
        yield MemoryBed(hostname)
        return
    cleanup: DockerCleanup = request.getfixturevalue("docker_cleanup")
    async with aiodocker.Docker() as docker:
        docker_bed = DockerBed(docker, hostname, cleanup)
        try:
            yield docker_bed
        finally:
            for replica in await docker_bed.containers.observe():
                await docker_bed.containers.remove(replica.id)


def desired(bed: Bed, function: str, *, hostname: str | None = None) -> DesiredService:
    return DesiredService(
        function=function,
        spec=ServiceSpec(kind="image", source=BASE, port=8080, replicas=2),
        image=ResolvedImage(image=BASE, image_id="", command=SERVE),
        env={"PORT": "8080", "MODE": "a"},
        env_hash="0123456789abcdef",
        routing=RoutingSettings(),
        hostname=hostname or bed.hostname,
    )


# --- ServiceContainers ----------------------------------------------------------------
async def test_start_observe_remove(bed: Bed, unique: str) -> None:
    function = f"{unique}-svc"
    assert await bed.containers.observe() == []
    want = desired(bed, function)
    first = await bed.containers.start(want, 0)
    second = await bed.containers.start(want, 1)
    observed = sorted(await bed.containers.observe(function), key=lambda r: r.slot)
    assert [(r.id, r.running) for r in observed] == [(first, True), (second, True)]
    for slot, replica in enumerate(observed):
        # every label the replica was started with (Docker adds the image's own)
        assert replica.labels.items() >= want.labels(slot).items()
    assert await bed.containers.observe(f"{unique}-other") == []
    assert {r.id for r in await bed.containers.observe()} == {first, second}
    await bed.containers.remove(first)
    assert [r.id for r in await bed.containers.observe(function)] == [second]
    await bed.containers.remove(first)  # already gone: fine


async def test_a_crashed_replica_is_observed_not_running(bed: Bed, unique: str) -> None:
    function = f"{unique}-svc"
    replica = await bed.containers.start(desired(bed, function), 0)
    await bed.crash(replica)
    [seen] = await bed.containers.observe(function)
    assert (seen.id, seen.running) == (replica, False)
    await bed.containers.remove(replica)
    assert await bed.containers.observe(function) == []


async def test_another_workers_replicas_are_never_observed(bed: Bed, unique: str) -> None:
    function = f"{unique}-svc"
    await bed.containers.start(desired(bed, function, hostname=f"{bed.hostname}-other"), 0)
    assert await bed.containers.observe() == []
    assert await bed.containers.observe(function) == []


async def test_network_exists_only_for_an_existing_network(bed: Bed, unique: str) -> None:
    assert not await bed.containers.network_exists(f"{unique}-net")
    await bed.add_network(f"{unique}-net")
    assert await bed.containers.network_exists(f"{unique}-net")


# --- ServiceImages -------------------------------------------------------------------
def function_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "fn"
    (directory / "app").mkdir(parents=True)
    (directory / "app" / "server.py").write_text("print('serving')\n")
    (directory / ".gitignore").write_text("notes.txt\nhidden.py\n")
    (directory / "hidden.py").write_text("print('not in the image')\n")
    (directory / "template.yaml").write_text("runtime: python3.14\n")
    return directory


async def test_source_version_is_the_selected_sources_fingerprint(
    bed: Bed, tmp_path: Path, unique: str
) -> None:
    directory = function_dir(tmp_path)
    version = await bed.images.source_version(f"{unique}-svc", directory)
    expected = fingerprint(read_sources(directory, select_sources(directory)))
    assert (version.fingerprint, version.image, version.runtime) == (expected, "", "")
    assert (version.dependency_image, version.built) == (None, False)
    (directory / "notes.txt").write_text("ignored\n")
    assert await bed.images.source_version(f"{unique}-svc", directory) == version
    with pytest.raises(RelayError, match="is not a directory"):
        await bed.images.source_version(f"{unique}-svc", tmp_path / "gone")


async def test_an_entrypoint_runs_the_function_image_with_its_runtime(
    bed: Bed, tmp_path: Path, unique: str
) -> None:
    directory = function_dir(tmp_path)
    spec = ServiceSpec(kind="entrypoint", source="app/server.py", port=8000)
    resolved = await bed.images.resolve(
        f"{unique}-svc", directory, spec, runtime="python3.14", function_image=BASE
    )
    assert (resolved.image, resolved.command) == (BASE, ("python", "-m", "app.server"))
    assert resolved.workdir == "/app"
    assert resolved.image_id.startswith("sha256:")
    assert resolved.env["PYTHONUNBUFFERED"] == "1"


@pytest.mark.parametrize(
    ("source", "runtime", "image", "error"),
    [
        ("app/server.py", None, BASE, "an entrypoint needs a runtime (got None)"),
        ("app/server.py", "python3.14", None, "the function image is not built yet"),
        ("hidden.py", "python3.14", BASE, "entrypoint hidden.py is not in the function's source"),
        ("missing.py", "python3.14", BASE, "entrypoint missing.py is not in the function's source"),
    ],
)
async def test_an_entrypoint_that_cannot_run_is_one_line_naming_the_service(
    bed: Bed, tmp_path: Path, unique: str, source: str, runtime: str | None,
    image: str | None, error: str,
) -> None:
    spec = ServiceSpec(kind="entrypoint", source=source, port=8000)
    with pytest.raises(RelayError) as raised:
        await bed.images.resolve(
            f"{unique}-svc", function_dir(tmp_path), spec, runtime=runtime, function_image=image
        )
    assert str(raised.value).startswith(f'service "{source}": {error}')
    assert "\n" not in str(raised.value)
