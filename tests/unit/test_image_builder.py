"""DockerImageBuilder's decisions against an in-memory engine: reuse, the build
bound, capped output, and what cleanup may remove."""

from __future__ import annotations

import builtins
import itertools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from aiodocker.exceptions import DockerError

from relay.adapters.docker.build_output import CappedOutput, summarize_failure
from relay.adapters.docker.images import DockerImageBuilder
from relay.adapters.fs.templates import load_template
from relay.domain.errors import BuildError

pytestmark = pytest.mark.anyio

PY_TEMPLATE = "runtime: python3.14\nevents:\n  - handler: h.handler\n    pattern:\n      a: [b]\n"


def _normal(name: str) -> str:
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


class FakeImages:
    """Images of an in-memory engine. Builds can be held at a gate per kind and
    told to fail; the highest number of simultaneous builds is recorded."""

    def __init__(self, engine: FakeEngine) -> None:
        self._engine = engine
        self._ids = itertools.count(1)
        self.by_id: dict[str, dict[str, Any]] = {}
        self.tags: dict[str, str] = {}
        self.built: list[tuple[str, str]] = []  # (kind, tag)
        self.active = 0
        self.max_active = 0
        self.gates: dict[str, anyio.Event] = {}
        self.fail_output: list[str] | None = None
        self._changed = anyio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        with anyio.fail_after(5):
            while not predicate():
                await self._changed.wait()

    def build(self, *, tag: str, labels: dict[str, str], stream: bool, **_: Any) -> Any:
        assert stream
        return self._build(tag, labels)

    async def _build(self, tag: str, labels: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        kind = labels["relay.type"]
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self._notify()
        try:
            gate = self.gates.get(kind)
            if gate is not None:
                await gate.wait()
            yield {"stream": f"Step 1/1 : building {tag}\n"}
            if self.fail_output is not None:
                for line in self.fail_output:
                    yield {"stream": line}
                yield {"error": "boom", "errorDetail": {"message": "RUN failed: exit 1"}}
                return
            image_id = f"sha256:{next(self._ids):064x}"
            old = self.tags.get(_normal(tag))
            if old is not None:
                self.by_id[old]["RepoTags"].remove(_normal(tag))
            self.by_id[image_id] = {"Id": image_id, "RepoTags": [_normal(tag)], "Labels": labels}
            self.tags[_normal(tag)] = image_id
            self.built.append((kind, tag))
        finally:
            self.active -= 1
            self._notify()

    async def inspect(self, name: str) -> dict[str, Any]:
        image_id = self.tags.get(_normal(name)) or (name if name in self.by_id else None)
        if image_id is None:
            raise DockerError(404, "no such image")
        image = self.by_id[image_id]
        return {"Id": image_id, "Config": {"Labels": image["Labels"]}}

    async def list(
        self, *, filters: dict[str, builtins.list[str]]
    ) -> builtins.list[dict[str, Any]]:
        wanted = [selector.split("=", 1) for selector in filters["label"]]
        return [
            {"Created": 1_000, **image}
            for image in self.by_id.values()
            if all(image["Labels"].get(k) == v for k, v in wanted)
        ]

    async def delete(self, name: str, *, force: bool = False) -> builtins.list[dict[str, str]]:
        assert not force
        image_id = self.tags.get(_normal(name)) or (name if name in self.by_id else None)
        if image_id is None:
            raise DockerError(404, "no such image")
        if any(c["ImageID"] == image_id for c in self._engine.containers.items):
            raise DockerError(409, "conflict: image is being used by a container")
        image = self.by_id[image_id]
        if name in self.tags or _normal(name) in self.tags:
            image["RepoTags"].remove(_normal(name))
            del self.tags[_normal(name)]
        if not image["RepoTags"]:
            del self.by_id[image_id]
        return [{"Untagged": name}]


class FakeContainers:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    async def list(self, **params: Any) -> list[dict[str, Any]]:
        assert params.get("all")
        return list(self.items)


class FakeEngine:
    def __init__(self) -> None:
        self.images = FakeImages(self)
        self.containers = FakeContainers()

    async def version(self) -> dict[str, Any]:
        # GET /version, the one call a socket proxy allows (not /info)
        return {"Arch": "amd64", "ApiVersion": "1.41"}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def builder(engine: FakeEngine) -> DockerImageBuilder:
    return DockerImageBuilder(engine)  # type: ignore[arg-type]  # an in-memory engine


def function_dir(root: Path, name: str, files: dict[str, str] | None = None) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / "template.yaml").write_text(PY_TEMPLATE)
    (directory / "h.py").write_text(f"def handler(event):\n    print({name!r})\n")
    for relative, text in (files or {}).items():
        (directory / relative).write_text(text)
    return directory


async def prepare(builder: DockerImageBuilder, name: str, directory: Path) -> Any:
    return await builder.prepare(name, directory, load_template(directory / "template.yaml"))


# --- prepare ------------------------------------------------------------------------
async def test_first_prepare_builds_dependency_then_function_and_later_ones_reuse(
    builder: DockerImageBuilder, engine: FakeEngine, tmp_path: Path
) -> None:
    directory = function_dir(tmp_path, "fn")
    first = await prepare(builder, "fn", directory)
    assert first.built
    assert [kind for kind, _ in engine.images.built] == ["dependency", "function"]
    assert first.dependency_image.startswith("relay-dep-python3.14-")
    again = await prepare(builder, "fn", directory)
    assert not again.built
    assert again.image == first.image
    assert len(engine.images.built) == 2
    assert builder._locks == {}  # per-image locks do not pile up


async def test_functions_with_the_same_dependencies_share_one_dependency_image(
    builder: DockerImageBuilder, engine: FakeEngine, tmp_path: Path
) -> None:
    a = await prepare(builder, "a", function_dir(tmp_path, "a"))
    b = await prepare(builder, "b", function_dir(tmp_path, "b"))
    assert a.dependency_image == b.dependency_image
    assert [kind for kind, _ in engine.images.built] == ["dependency", "function", "function"]
    c = await prepare(builder, "c", function_dir(tmp_path, "c", {"requirements.txt": "six\n"}))
    assert c.dependency_image != a.dependency_image


async def test_a_different_recipe_rebuilds_the_same_tag(
    builder: DockerImageBuilder, engine: FakeEngine, tmp_path: Path
) -> None:
    directory = function_dir(tmp_path, "fn")
    first = await prepare(builder, "fn", directory)
    image_id = engine.images.tags[first.image]
    engine.images.by_id[image_id]["Labels"]["relay.build"] = "from-an-older-relay"
    again = await prepare(builder, "fn", directory)
    assert (again.image, again.built) == (first.image, True)


async def test_project_errors_fail_before_any_build(
    builder: DockerImageBuilder, engine: FakeEngine, tmp_path: Path
) -> None:
    directory = function_dir(tmp_path, "fn", {"pyproject.toml": "[project]\n"})
    with pytest.raises(BuildError, match=r'^function "fn": pyproject\.toml without uv\.lock'):
        await prepare(builder, "fn", directory)
    assert engine.images.built == []


async def test_builds_are_bounded(
    builder: DockerImageBuilder, engine: FakeEngine, tmp_path: Path
) -> None:
    gate = engine.images.gates["function"] = anyio.Event()
    async with anyio.create_task_group() as tg:
        for index in range(5):
            tg.start_soon(prepare, builder, f"f{index}", function_dir(tmp_path, f"f{index}"))
        await engine.images.wait_until(lambda: engine.images.active == 2)
        for _ in range(200):  # a sustained window, not a sleep
            assert engine.images.active <= 2
            await anyio.lowlevel.checkpoint()
        gate.set()
    assert engine.images.max_active == 2
    assert len([k for k, _ in engine.images.built if k == "function"]) == 5


async def test_a_failed_build_keeps_the_tail_of_its_output(
    engine: FakeEngine, tmp_path: Path
) -> None:
    builder = DockerImageBuilder(engine, output_cap=200)  # type: ignore[arg-type]
    engine.images.fail_output = [f"line {n}\n" for n in range(100)]
    with pytest.raises(BuildError) as caught:
        await prepare(builder, "fn", function_dir(tmp_path, "fn"))
    assert str(caught.value) == 'function "fn": dependency image build failed: RUN failed: exit 1'
    output = caught.value.output
    assert output.startswith("[... ")
    assert "bytes of earlier build output truncated" in output
    assert output.rstrip().endswith("RUN failed: exit 1")
    assert len(output.split("\n", 1)[1].encode()) <= 200


def test_capped_output_keeps_everything_under_the_cap() -> None:
    output = CappedOutput(cap=10)
    output.add("abc")
    output.add("def")
    assert output.text() == "abcdef"
    output.add("0123456789")
    assert output.text() == "[... 6 bytes of earlier build output truncated ...]\n0123456789"


def test_a_failure_summary_names_the_tool_error_not_the_command() -> None:
    command = "The command '/bin/sh -c npm ci --omit=dev' returned a non-zero code: 1"
    output = (
        "Step 5/5 : RUN npm ci\n ---> Running in abc\n"
        "npm warn old lockfile\n\x1b[91mnpm error code EUSAGE\x1b[0m\n"
        "npm error The package-lock.json is out of sync\nnpm error Run npm install\n"
        "Removing intermediate container abc\n" + command + "\n"
    )
    assert summarize_failure(command, output) == "exit code 1: npm error Run npm install"
    assert summarize_failure(command, command + "\n") == "exit code 1"
    assert summarize_failure("COPY failed: no source files", "") == "COPY failed: no source files"
    long = "error: " + "x" * 500
    assert len(summarize_failure(command, long)) == 300


# --- cleanup ------------------------------------------------------------------------
async def test_retire_removes_old_versions_not_kept_and_not_in_use(
    builder: DockerImageBuilder, engine: FakeEngine, tmp_path: Path
) -> None:
    directory = function_dir(tmp_path, "fn")
    v1 = await prepare(builder, "fn", directory)
    (directory / "h.py").write_text("def handler(e):\n    pass\n")
    v2 = await prepare(builder, "fn", directory)
    (directory / "h.py").write_text("def handler(e):\n    return 3\n")
    v3 = await prepare(builder, "fn", directory)
    other = await prepare(builder, "other", function_dir(tmp_path, "other"))
    engine.containers.items.append(
        {"Labels": {"relay.image": v1.image}, "ImageID": "sha256:elsewhere"}
    )
    engine.containers.items.append({"Labels": {}, "ImageID": engine.images.tags[v2.image]})

    assert await builder.retire("fn", keep=[v3.image]) == []  # v1 by label, v2 by image id
    engine.containers.items.clear()
    assert sorted(await builder.retire("fn", keep=[v3.image])) == sorted([v1.image, v2.image])
    assert v3.image in engine.images.tags
    assert other.image in engine.images.tags
    assert _normal(v3.dependency_image) in engine.images.tags  # still referenced


async def test_dependency_images_go_with_their_last_function_image(
    builder: DockerImageBuilder, engine: FakeEngine, tmp_path: Path
) -> None:
    fn = await prepare(builder, "fn", function_dir(tmp_path, "fn", {"requirements.txt": "x"}))
    unlabelled = "sha256:" + "f" * 64
    engine.images.by_id[unlabelled] = {
        "Id": unlabelled,
        "RepoTags": ["relay-dep-python3.14-0000:latest"],
        "Labels": {},
    }
    assert await builder.collect_dependency_images() == []
    assert await builder.retire("fn", keep=[]) == [fn.image]
    assert _normal(fn.dependency_image) not in engine.images.tags
    assert unlabelled in engine.images.by_id  # no relay.type: never touched


async def test_a_young_unreferenced_dependency_image_waits_for_the_grace(
    engine: FakeEngine, tmp_path: Path
) -> None:
    builder = DockerImageBuilder(engine, collect_grace=60)  # type: ignore[arg-type]
    fn = await prepare(builder, "fn", function_dir(tmp_path, "fn"))
    dep_id = engine.images.tags[_normal(fn.dependency_image)]
    engine.images.by_id[dep_id]["Created"] = time.time()
    assert await builder.retire("fn", keep=[]) == [fn.image]
    assert dep_id in engine.images.by_id
    engine.images.by_id[dep_id]["Created"] = time.time() - 120
    assert await builder.collect_dependency_images() == [_normal(fn.dependency_image)]


async def test_an_in_flight_prepare_protects_its_dependency_image(
    builder: DockerImageBuilder, engine: FakeEngine, tmp_path: Path
) -> None:
    gate = engine.images.gates["function"] = anyio.Event()
    directory = function_dir(tmp_path, "fn", {"requirements.txt": "x"})
    async with anyio.create_task_group() as tg:
        tg.start_soon(prepare, builder, "fn", directory)
        await engine.images.wait_until(
            lambda: engine.images.active == 1 and bool(engine.images.built)
        )
        assert await builder.collect_dependency_images() == []
        gate.set()
    assert len(engine.images.built) == 2


async def test_scope_labels_narrow_cleanup(engine: FakeEngine, tmp_path: Path) -> None:
    mine = DockerImageBuilder(engine, labels={"relay.test.id": "mine"})  # type: ignore[arg-type]
    theirs = DockerImageBuilder(engine)  # type: ignore[arg-type]
    a = await prepare(theirs, "shared-name", function_dir(tmp_path, "a"))
    assert await mine.retire("shared-name", keep=[]) == []
    assert await mine.collect_dependency_images() == []
    assert a.image in engine.images.tags


async def test_failed_build_leftovers_are_collected_once_no_build_can_need_them(
    engine: FakeEngine, tmp_path: Path
) -> None:
    builder = DockerImageBuilder(engine, collect_grace=60)  # type: ignore[arg-type]
    now = time.time()
    for name, created in (("old", now - 3600), ("young", now - 5)):
        engine.images.by_id[name] = {
            "Id": name,
            "RepoTags": [],
            "Created": created,
            "Labels": {"relay.type": "dependency-stage"},
        }
    engine.images.by_id["fn-old"] = {
        "Id": "fn-old",
        "RepoTags": [],
        "Created": now - 3600,
        "Labels": {"relay.type": "function-stage", "relay.function": "fn"},
    }
    gate = engine.images.gates["dependency"] = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(prepare, builder, "other", function_dir(tmp_path, "other"))
        await engine.images.wait_until(lambda: engine.images.active == 1)
        await builder.collect_dependency_images()  # a build is running: nothing goes
        assert {"old", "young"} <= set(engine.images.by_id)
        gate.set()
    await builder.collect_dependency_images()
    assert "old" not in engine.images.by_id
    assert "young" in engine.images.by_id  # may still be a running build's base
    await builder.retire("fn", keep=[])
    assert "fn-old" not in engine.images.by_id


async def test_the_architecture_comes_from_version_under_the_name_info_gave(
    builder: DockerImageBuilder, engine: FakeEngine
) -> None:
    # A socket proxy allows /version, not /info; /version says GOARCH ("amd64"), and
    # image versions were hashed with /info's uname -m name ("x86_64"): keep that name,
    # so no image version changes.
    assert not hasattr(engine, "system")  # nothing may call /info
    assert await builder._arch() == "x86_64"
