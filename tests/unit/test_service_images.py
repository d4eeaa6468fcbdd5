"""External image freshness of ``DockerServiceImages`` over a scripted engine (a
stand-in for aiodocker's image API, not for any of Relay's modules)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiodocker.exceptions import DockerError

from relay.adapters.docker.services import FRESHNESS_S, DockerServiceImages
from relay.domain.errors import RelayError
from relay.domain.template import ServiceSpec

pytestmark = pytest.mark.anyio


class ScriptedImages:
    """``inspect`` answers from ``local``; ``pull`` fails while ``registry_down``."""

    def __init__(self) -> None:
        self.local: dict[str, str] = {}
        self.registry_down = False
        self.pulls: list[str] = []

    async def inspect(self, ref: str) -> dict[str, Any]:
        if ref not in self.local:
            raise DockerError(404, f"No such image: {ref}")
        return {"Id": self.local[ref]}

    async def pull(self, ref: str) -> None:
        self.pulls.append(ref)
        if self.registry_down:
            raise DockerError(500, "registry unreachable")
        self.local[ref] = f"sha256:pulled-{len(self.pulls)}"


class ScriptedDocker:
    def __init__(self) -> None:
        self.images = ScriptedImages()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _service(ref: str = "ghcr.io/acme/api:1.2") -> ServiceSpec:
    return ServiceSpec(kind="image", source=ref, port=9090)


async def _resolve(images: DockerServiceImages, service: ServiceSpec) -> str:
    resolved = await images.resolve(
        "fn", Path("/nowhere"), service, runtime=None, function_image=None
    )
    return resolved.image_id


@pytest.fixture
def engine() -> ScriptedDocker:
    return ScriptedDocker()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def images(engine: ScriptedDocker, clock: Clock) -> DockerServiceImages:
    return DockerServiceImages(engine, monotonic=clock)  # type: ignore[arg-type]  # scripted engine


async def test_a_missing_image_is_pulled_then_not_checked_again_within_the_hour(
    images: DockerServiceImages, engine: ScriptedDocker, clock: Clock
) -> None:
    assert await _resolve(images, _service()) == "sha256:pulled-1"
    clock.now += FRESHNESS_S - 1
    assert await _resolve(images, _service()) == "sha256:pulled-1"
    assert engine.images.pulls == ["ghcr.io/acme/api:1.2"]
    clock.now += 1
    assert await _resolve(images, _service()) == "sha256:pulled-2"  # new content for the tag


async def test_a_failed_check_keeps_the_local_image_and_does_not_open_the_window(
    images: DockerServiceImages, engine: ScriptedDocker
) -> None:
    engine.images.local["ghcr.io/acme/api:1.2"] = "sha256:local"
    engine.images.registry_down = True
    assert await _resolve(images, _service()) == "sha256:local"
    assert await _resolve(images, _service()) == "sha256:local"
    assert len(engine.images.pulls) == 2  # retried at the next pass
    engine.images.registry_down = False
    await _resolve(images, _service())
    await _resolve(images, _service())
    assert len(engine.images.pulls) == 3  # a success opens the window


async def test_a_new_identity_is_checked_at_once(
    images: DockerServiceImages, engine: ScriptedDocker
) -> None:
    await _resolve(images, _service("ghcr.io/acme/api:1.2"))
    await _resolve(images, _service("ghcr.io/acme/api:1.3"))
    assert engine.images.pulls == ["ghcr.io/acme/api:1.2", "ghcr.io/acme/api:1.3"]


async def test_missing_and_unpullable_is_one_line_naming_the_service(
    images: DockerServiceImages, engine: ScriptedDocker
) -> None:
    engine.images.registry_down = True
    with pytest.raises(RelayError) as caught:
        await _resolve(images, _service())
    assert str(caught.value) == (
        'service "ghcr.io/acme/api:1.2": image ghcr.io/acme/api:1.2 is not available '
        "locally and pulling it failed: registry unreachable"
    )
