"""The ImageBuilder contract, on the in-memory fake and on Docker (a small Python
function over the stand-in base image; its dependency image is this module's own,
removed at the end)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiodocker
import msgspec
import pytest

from relay.adapters.docker.images import DockerImageBuilder
from relay.adapters.fs.source import read_sources, select_sources
from relay.adapters.fs.templates import load_template_text
from relay.application.ports import ImageBuilder
from relay.domain.errors import BuildError
from relay.domain.functions import FunctionImage
from relay.domain.source import fingerprint
from relay.domain.template import Template
from tests.fakes import InMemoryImageBuilder
from tests.testbed import TEST_ID_LABEL, TEST_LABEL, DockerEngine

pytestmark = pytest.mark.anyio

TEMPLATE = """\
runtime: python3.14
events:
  - handler: events.created.handler
    pattern:
      event_name: [INSERT]
"""
HANDLER = 'def handler(event):\n    print("created", event)\n'


@pytest.fixture(scope="module")
def module_labels(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """Labels of this module's Docker builders; what carries them goes at the end
    (children before their bases)."""
    engine: DockerEngine = request.getfixturevalue("docker_engine")
    labels = {TEST_LABEL: "true", TEST_ID_LABEL: f"builder-contract-{secrets.token_hex(4)}"}
    yield labels
    selector = f"{TEST_ID_LABEL}={labels[TEST_ID_LABEL]}"
    for kind in ("function", "function-stage", "dependency", "dependency-stage"):
        for image in engine.client.images.list(filters={"label": [selector, f"relay.type={kind}"]}):
            for ref in image.tags or [image.id]:
                engine.client.images.remove(ref, force=True)


class Bed:
    def __init__(
        self, builder: ImageBuilder, name: str, directory: Path,
        another: Callable[[], ImageBuilder] | None = None,
    ) -> None:
        self.builder = builder
        self.another = another  # a second worker's builder on the same engine
        self.name = name
        self.directory = directory
        (directory / "events").mkdir(parents=True)
        (directory / "events" / "created.py").write_text(HANDLER)
        (directory / ".gitignore").write_text("notes.txt\n")
        (directory / "template.yaml").write_text(TEMPLATE)

    def template(self) -> Template:
        return load_template_text((self.directory / "template.yaml").read_text())

    async def prepare(self) -> FunctionImage:
        return await self.builder.prepare(self.name, self.directory, self.template())

    def break_install(self) -> None:
        """Make the dependency install fail (a requirement that is not one)."""
        (self.directory / "requirements.txt").write_text("six ==== not a version\n")


class MemoryBed(Bed):
    def __init__(self, name: str, directory: Path) -> None:
        self.fake = InMemoryImageBuilder()
        super().__init__(self.fake, name, directory,
                         lambda: InMemoryImageBuilder(self.fake.images, self.fake.recent))

    def break_install(self) -> None:
        super().break_install()
        self.fake.failures[self.name] = (
            f'function "{self.name}": dependency image build failed: exit code 2: error:'
            " Failed to parse: `six ==== not a version`"
        )


@pytest.fixture(params=["memory", pytest.param("docker", marks=pytest.mark.docker)])
async def bed(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> AsyncIterator[Bed]:
    name, directory = f"{unique}-fn", tmp_path / "fn"
    if request.param == "memory":
        yield MemoryBed(name, directory)
        return
    request.getfixturevalue("docker_cleanup")  # removes the tags naming ``unique``
    labels: dict[str, str] = request.getfixturevalue("module_labels")
    async with aiodocker.Docker() as docker:
        yield Bed(DockerImageBuilder(docker, labels=labels), name, directory,
                  lambda: DockerImageBuilder(docker, labels=labels))


async def test_prepare_builds_once_then_reuses(bed: Bed) -> None:
    first = await bed.prepare()
    assert first.built
    assert (first.function, first.runtime) == (bed.name, "python3.14")
    source = read_sources(bed.directory, select_sources(bed.directory))
    assert first.fingerprint == fingerprint(source)
    assert first.image == f"relay-fn-{bed.name}:{first.fingerprint[:16]}"
    assert str(first.dependency_image).startswith("relay-dep-python3.14-")
    assert await bed.prepare() == msgspec.structs.replace(first, built=False)


async def test_a_source_edit_builds_a_new_tag_and_an_ignored_file_does_not(bed: Bed) -> None:
    first = await bed.prepare()
    (bed.directory / "notes.txt").write_text("ignored by .gitignore\n")
    assert await bed.prepare() == msgspec.structs.replace(first, built=False)
    (bed.directory / "events" / "created.py").write_text(HANDLER + "# v2\n")
    second = await bed.prepare()
    assert second.built
    assert second.image != first.image
    assert second.dependency_image == first.dependency_image


async def test_a_template_without_runtime_is_one_build_error_line(bed: Bed) -> None:
    (bed.directory / "template.yaml").write_text("services:\n  - image: nginx:1\n    port: 80\n")
    with pytest.raises(BuildError) as raised:
        await bed.prepare()
    assert str(raised.value) == (
        f'function "{bed.name}": the template declares no runtime; a handler needs one'
    )


async def test_a_failing_build_is_one_line_naming_the_function_with_its_log(bed: Bed) -> None:
    bed.break_install()
    with pytest.raises(BuildError) as raised:
        await bed.prepare()
    message = str(raised.value)
    assert message.startswith(f'function "{bed.name}": dependency image build failed: ')
    assert "\n" not in message
    assert raised.value.output


async def test_retire_removes_what_is_not_kept(bed: Bed) -> None:
    old = await bed.prepare()
    (bed.directory / "events" / "created.py").write_text(HANDLER + "# v2\n")
    new = await bed.prepare()
    assert await bed.builder.retire(bed.name, keep=[new.image]) == [old.image]
    assert await bed.builder.retire(bed.name, keep=[new.image]) == []
    assert not (await bed.prepare()).built  # the kept one is still there
    (bed.directory / "events" / "created.py").write_text(HANDLER)
    rebuilt = await bed.prepare()  # the retired one is gone: built again
    assert (rebuilt.image, rebuilt.built) == (old.image, True)


async def test_retire_of_an_unknown_function_removes_nothing(bed: Bed) -> None:
    assert await bed.builder.retire(f"{bed.name}-never", keep=[]) == []


async def test_retire_leaves_another_workers_fresh_image_of_the_same_name(bed: Bed) -> None:
    """Two workers on one engine serving a function of one name from other sources
    (a rolling deploy, or two teams' directories): neither retires the other's
    image while it is fresh (its containers may not have started yet); each still
    retires its own superseded one at once."""
    assert bed.another is not None
    other = bed.another()
    mine = await bed.prepare()
    (bed.directory / "events" / "created.py").write_text(HANDLER + "# theirs\n")
    theirs = await other.prepare(bed.name, bed.directory, bed.template())
    assert theirs.image != mine.image
    assert await bed.builder.retire(bed.name, keep=[mine.image]) == []
    assert await other.retire(bed.name, keep=[theirs.image]) == []
    (bed.directory / "events" / "created.py").write_text(HANDLER + "# mine, v2\n")
    newer = await bed.prepare()
    assert await bed.builder.retire(bed.name, keep=[newer.image]) == [mine.image]
    (bed.directory / "events" / "created.py").write_text(HANDLER + "# theirs\n")
    again = await other.prepare(bed.name, bed.directory, bed.template())
    assert (again.image, again.built) == (theirs.image, False)  # never removed
