"""DockerImageBuilder against the real engine and the stand-in base images.

Dependency images are shared by every test of this module: they carry the
module's own ``relay.test.id`` label (which also enters their fingerprint, so
they never collide with anyone else's) and are removed when the module ends.
Function images are named after the test's ``unique`` and removed after each
test by ``docker_cleanup``.

Timings on the 2-core test machine (informational, never asserted; measured
with ``bench/images.py`` while other suites shared the engine, load 4-6): a
cold dependency image 1-6 s (``six`` through the proxy for uv, ``npm ci``), a
function image on a warm dependency image 0.8-2 s, a TypeScript function image
4-9 s (esbuild is installed and removed inside that build), a reuse 2-60 ms.
The whole module takes 70-120 s.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiodocker
import anyio
import pytest

from relay.adapters.docker.images import DockerImageBuilder
from relay.adapters.docker.runtimes import RUNTIMES, Runtime
from relay.adapters.fs.templates import load_template
from relay.domain.errors import BuildError
from relay.domain.functions import FunctionImage
from tests.testbed import TEST_ID_LABEL, TEST_LABEL, DockerCleanup, DockerEngine

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "functions"
FIXTURES = Path(__file__).resolve().parent / "image_fixtures"
USER_EVENT = {
    "event_id": "evt_123",
    "event_name": "INSERT",
    "table_name": "users",
    "new_image": {"id": "user_123", "name": "John Doe", "email": "john@example.com"},
}


@pytest.fixture(scope="module")
def image_labels(docker_engine: DockerEngine) -> Iterator[dict[str, str]]:
    """Labels of this module's builders; everything carrying them goes at the end."""
    labels = {TEST_LABEL: "true", TEST_ID_LABEL: f"images-{secrets.token_hex(4)}"}
    yield labels
    client = docker_engine.client
    selector = f"{TEST_ID_LABEL}={labels[TEST_ID_LABEL]}"
    kinds = ("function", "function-stage", "dependency", "dependency-stage")
    for kind in kinds:  # children before their bases
        for image in client.images.list(filters={"label": [selector, f"relay.type={kind}"]}):
            for ref in image.tags or [image.id]:
                client.images.remove(ref)


@pytest.fixture
async def docker() -> AsyncIterator[aiodocker.Docker]:
    async with aiodocker.Docker() as client:
        yield client


@pytest.fixture
def builder(docker: aiodocker.Docker, image_labels: dict[str, str]) -> DockerImageBuilder:
    return DockerImageBuilder(docker, labels=image_labels)


def copy_function(source: Path, tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(source, target)
    return target


async def prepare(builder: DockerImageBuilder, name: str, directory: Path) -> FunctionImage:
    return await builder.prepare(name, directory, load_template(directory / "template.yaml"))


def run_handler(
    engine: DockerEngine, image: FunctionImage, handler: str, event: dict[str, Any]
) -> str:
    """One request through the image's own bootstrap, in a container hardened like
    the runtime's (uid 10001, read-only root, no capabilities); returns its output."""
    request = json.dumps(
        {"id": "n1", "handler": handler, "env": {}, "event": json.dumps(event), "timeout_s": 10}
    )
    command = "python -u /relay/bootstrap.py"
    if image.runtime == "node24":
        command = "node /relay/bootstrap.mjs"
    output: bytes = engine.client.containers.run(
        image.image,
        ["/bin/sh", "-c", f'printf "%s\\n" "$RELAY_TEST_REQUEST" | {command}'],
        environment={"RELAY_TEST_REQUEST": request},
        user="10001",
        read_only=True,
        tmpfs={"/tmp": "size=16m"},
        cap_drop=["ALL"],
        network_disabled=True,
        labels={TEST_LABEL: "true"},
        remove=True,
        stdout=True,
        stderr=True,
    )
    text = output.decode()
    assert '"ok": true' in text.replace('":true', '": true'), text
    return text


def image_labels_of(engine: DockerEngine, tag: str) -> dict[str, str]:
    labels: dict[str, str] = engine.client.images.get(tag).labels
    return labels


# --- versions ---------------------------------------------------------------------
async def test_unchanged_source_reuses_the_tag_without_a_build(
    builder: DockerImageBuilder,
    docker: aiodocker.Docker,
    image_labels: dict[str, str],
    tmp_path: Path,
    unique: str,
    docker_cleanup: DockerCleanup,
    docker_engine: DockerEngine,
) -> None:
    directory = copy_function(EXAMPLES / "user-events-python", tmp_path, "fn")
    first = await prepare(builder, f"{unique}-py", directory)
    assert first.built
    assert first.image == f"relay-fn-{unique}-py:{first.fingerprint[:16]}"
    again = await prepare(builder, f"{unique}-py", directory)
    assert again == FunctionImage(**{**_fields(first), "built": False})
    # A fresh builder (a restarted worker) reuses it too: the engine is the memory.
    fresh = DockerImageBuilder(docker, labels=image_labels)
    assert not (await prepare(fresh, f"{unique}-py", directory)).built

    labels = image_labels_of(docker_engine, first.image)
    assert labels["relay.type"] == "function"
    assert labels["relay.function"] == f"{unique}-py"
    assert labels["relay.runtime"] == "python3.14"
    assert labels["relay.fingerprint"] == first.fingerprint
    assert labels["relay.dependency"] == first.dependency_image
    assert labels["relay.bootstrap-version"]
    dep = image_labels_of(docker_engine, str(first.dependency_image))
    assert dep["relay.type"] == "dependency"
    assert dep["relay.runtime"] == "python3.14"
    assert len(dep["relay.fingerprint"]) == 64
    assert str(first.dependency_image).endswith(dep["relay.fingerprint"][:16])

    out = run_handler(docker_engine, first, "events.created.handler", USER_EVENT)
    assert "User created: user_123" in out


async def test_source_template_and_rule_edits_make_new_tags_ignored_edits_do_not(
    builder: DockerImageBuilder, tmp_path: Path, unique: str, docker_cleanup: DockerCleanup
) -> None:
    directory = copy_function(EXAMPLES / "user-events-python", tmp_path, "fn")
    (directory / ".gitignore").write_text("*.log\n")
    name = f"{unique}-edits"
    tags = [(await prepare(builder, name, directory)).image]

    (directory / "debug.log").write_text("noise")
    ignored = await prepare(builder, name, directory)
    assert (ignored.image, ignored.built) == (tags[0], False)

    (directory / "events" / "created.py").write_text(
        "def handler(event):\n    print('v2', event['new_image']['id'])\n"
    )
    tags.append((await prepare(builder, name, directory)).image)

    template = directory / "template.yaml"
    template.write_text(template.read_text() + "concurrency: 3\n")
    tags.append((await prepare(builder, name, directory)).image)

    (directory / ".gitignore").write_text("*.log\n*.tmp\n")
    tags.append((await prepare(builder, name, directory)).image)

    assert len(set(tags)) == 4, tags


async def test_build_context_is_the_selection_without_the_template(
    builder: DockerImageBuilder,
    tmp_path: Path,
    unique: str,
    docker_cleanup: DockerCleanup,
    docker_engine: DockerEngine,
) -> None:
    directory = copy_function(EXAMPLES / "user-events-python", tmp_path, "fn")
    (directory / ".gitignore").write_text("secret.env\n")
    (directory / "secret.env").write_text("TOKEN=x")
    outside = tmp_path / "host-only.txt"
    outside.write_text("host")
    (directory / "escape.txt").symlink_to(outside)
    (directory / "events" / "created.py").chmod(0o600)  # unreadable to others on the host
    before = sorted(p.name for p in directory.rglob("*"))
    image = await prepare(builder, f"{unique}-ctx", directory)
    assert sorted(p.name for p in directory.rglob("*")) == before  # nothing written

    listing: bytes = docker_engine.client.containers.run(
        image.image,
        [
            "python",
            "-c",
            "import os\nfor d, _, fs in os.walk('/app'):\n"
            "    for f in fs:\n        p = os.path.join(d, f); open(p, 'rb').read(); print(p)",
        ],
        user="10001",
        read_only=True,
        labels={TEST_LABEL: "true"},
        remove=True,
    )
    assert sorted(listing.decode().split()) == [
        "/app/.gitignore",
        "/app/events/created.py",
        "/app/events/deleted.py",
        "/app/events/updated.py",
    ]


async def test_a_recipe_change_rebuilds_the_same_tag_and_retire_collects_the_old_image(
    docker: aiodocker.Docker,
    image_labels: dict[str, str],
    tmp_path: Path,
    unique: str,
    docker_cleanup: DockerCleanup,
    docker_engine: DockerEngine,
) -> None:
    directory = copy_function(EXAMPLES / "user-events-python", tmp_path, "fn")
    name = f"{unique}-recipe"
    old = await prepare(DockerImageBuilder(docker, labels=image_labels), name, directory)
    old_id = docker_engine.client.images.get(old.image).id
    base = RUNTIMES["python3.14"]
    changed = {
        **RUNTIMES,
        "python3.14": Runtime(
            name=base.name,
            base_image=base.base_image,
            installer=base.installer,
            dependency_preamble=base.dependency_preamble,
            env={**base.env, "RELAY_TEST_RECIPE": "2"},
            plan_dependencies=base.plan_dependencies,
        ),
    }
    new_builder = DockerImageBuilder(docker, labels=image_labels, runtimes=changed)
    new = await prepare(new_builder, name, directory)
    assert (new.image, new.built) == (old.image, True)
    assert docker_engine.client.images.get(new.image).id != old_id
    docker_cleanup.image(old_id)

    assert await new_builder.retire(name, keep=[new.image]) == [old_id]
    assert docker_engine.client.images.get(new.image)


# --- dependencies and runtimes ---------------------------------------------------------
@pytest.mark.parametrize(
    ("fixture", "handler", "event", "expected"),
    [
        ("python-requirements", "handler.handler", {}, "six 1.16.0 from requirements.txt"),
        ("python-uv-lock", "handler.handler", {}, "six 1.16.0 from the lock"),
        ("node-package-lock", "handler.handler", {"value": "42"}, "is-number says true"),
    ],
)
async def test_dependency_manifests_install_into_a_shared_dependency_image(
    builder: DockerImageBuilder,
    tmp_path: Path,
    unique: str,
    docker_cleanup: DockerCleanup,
    docker_engine: DockerEngine,
    fixture: str,
    handler: str,
    event: dict[str, Any],
    expected: str,
) -> None:
    directory = copy_function(FIXTURES / fixture, tmp_path, "fn")
    image = await prepare(builder, f"{unique}-a", directory)
    assert expected in run_handler(docker_engine, image, handler, event)

    # Another function with the same manifests shares the dependency image.
    (directory / "extra.txt").write_text("other source")
    other = await prepare(builder, f"{unique}-b", directory)
    assert other.dependency_image == image.dependency_image
    assert other.image != image.image


async def test_node_examples_build_and_run(
    builder: DockerImageBuilder,
    tmp_path: Path,
    unique: str,
    docker_cleanup: DockerCleanup,
    docker_engine: DockerEngine,
) -> None:
    email = await prepare(builder, f"{unique}-email", EXAMPLES / "welcome-email-node")
    out = run_handler(docker_engine, email, "handler.handler", USER_EVENT)
    assert "Sending welcome email to john@example.com" in out

    order = {
        "type": "order.created",
        "order_id": "o-1",
        "customer": {"name": "Ada", "email": "ada@example.com"},
        "lines": [{"sku": "x", "quantity": 2, "unit_price": 3.5}],
    }
    ts = await prepare(builder, f"{unique}-ts", EXAMPLES / "order-confirmation-typescript")
    out = run_handler(docker_engine, ts, "src.handler.handler", order)
    assert "Order o-1 confirmed for ada@example.com: 1 item(s), total 7.00" in out
    files: bytes = docker_engine.client.containers.run(
        ts.image,
        ["sh", "-c", "ls /app/src; ls /tmp /root/.npm 2>&1; command -v esbuild || true"],
        labels={TEST_LABEL: "true"},
        remove=True,
    )
    listing = files.decode()
    assert "handler.mjs" in listing
    assert "relay-esbuild" not in listing  # no build tooling in the execution layer


async def test_ambiguous_typescript_module_fails_before_any_build(
    builder: DockerImageBuilder,
    docker: aiodocker.Docker,
    tmp_path: Path,
    unique: str,
    docker_cleanup: DockerCleanup,
) -> None:
    directory = copy_function(EXAMPLES / "order-confirmation-typescript", tmp_path, "fn")
    (directory / "src" / "handler.js").write_text("export function handler() {}\n")
    with pytest.raises(BuildError) as caught:
        await prepare(builder, f"{unique}-amb", directory)
    message = str(caught.value)
    assert f'function "{unique}-amb"' in message
    assert "'src.handler' is ambiguous" in message
    assert "src/handler.js" in message
    assert "src/handler.ts" in message
    images = await docker.images.list(filters={"label": [f"relay.function={unique}-amb"]})
    assert images == []


async def test_a_failing_install_is_a_build_error_with_the_output(
    builder: DockerImageBuilder, tmp_path: Path, unique: str, docker_cleanup: DockerCleanup
) -> None:
    directory = copy_function(FIXTURES / "python-requirements", tmp_path, "fn")
    (directory / "requirements.txt").write_text("six ==== not a version\n")
    with pytest.raises(BuildError) as caught:
        await prepare(builder, f"{unique}-bad", directory)
    assert "dependency image build failed" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert "uv pip install" in caught.value.output or "six" in caught.value.output


async def test_an_out_of_date_uv_lock_fails_the_build(
    builder: DockerImageBuilder, tmp_path: Path, unique: str, docker_cleanup: DockerCleanup
) -> None:
    directory = copy_function(FIXTURES / "python-uv-lock", tmp_path, "fn")
    pyproject = directory / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("six==1.16.0", "six==1.15.0"))
    with pytest.raises(BuildError) as caught:
        await prepare(builder, f"{unique}-stale", directory)
    assert str(caught.value) == (
        f'function "{unique}-stale": dependency image build failed: exit code 1: error: The'
        " lockfile at `uv.lock` needs to be updated, but `--locked` was provided."
    )


async def test_what_a_failed_build_leaves_is_collected(
    docker: aiodocker.Docker, tmp_path: Path, unique: str, docker_cleanup: DockerCleanup
) -> None:
    builder = DockerImageBuilder(docker, labels=docker_cleanup.labels, collect_grace=0)
    directory = copy_function(FIXTURES / "python-requirements", tmp_path, "fn")
    (directory / "requirements.txt").write_text("six ==== not a version\n")
    with pytest.raises(BuildError):
        await prepare(builder, f"{unique}-left", directory)
    selector = {"label": [f"{TEST_ID_LABEL}={unique}", "relay.type=dependency-stage"]}
    assert await docker.images.list(filters=selector)  # the steps before the failing RUN
    await builder.collect_dependency_images()
    assert await docker.images.list(filters=selector) == []


# --- cleanup ------------------------------------------------------------------------
async def test_retire_keeps_images_a_container_references(
    builder: DockerImageBuilder,
    docker: aiodocker.Docker,
    tmp_path: Path,
    unique: str,
    docker_cleanup: DockerCleanup,
    docker_engine: DockerEngine,
) -> None:
    directory = copy_function(EXAMPLES / "user-events-python", tmp_path, "fn")
    name = f"{unique}-retire"
    old = await prepare(builder, name, directory)
    (directory / "events" / "deleted.py").write_text("def handler(event):\n    pass\n")
    new = await prepare(builder, name, directory)

    # An in-flight container (any state counts) still on the old version.
    container = docker_engine.client.containers.create(
        old.image,
        ["true"],
        labels={**docker_cleanup.labels, "relay.image": old.image},
        name=f"{unique}-inflight",
    )
    assert await builder.retire(name, keep=[new.image]) == []
    assert docker_engine.client.images.get(old.image)

    container.remove()
    assert await builder.retire(name, keep=[new.image]) == [old.image]
    assert docker_engine.client.images.get(new.image)
    assert await builder.retire(name, keep=[new.image]) == []


async def test_dependency_images_are_collected_only_when_unreferenced(
    docker: aiodocker.Docker,
    tmp_path: Path,
    unique: str,
    docker_cleanup: DockerCleanup,
    docker_engine: DockerEngine,
) -> None:
    # A builder of its own (labels unique to this test) so collecting cannot
    # remove the dependency images the other tests share.
    builder = DockerImageBuilder(docker, labels=docker_cleanup.labels, collect_grace=0)
    one = await prepare(builder, f"{unique}-one", EXAMPLES / "user-events-python")
    two = await prepare(builder, f"{unique}-two", EXAMPLES / "welcome-email-node")
    # A look-alike without relay.type is never touched.
    lookalike = f"relay-dep-python3.14-{unique}"
    docker_engine.client.images.get("python:3.14-slim").tag(lookalike)
    docker_cleanup.image(lookalike)

    assert await builder.collect_dependency_images() == []
    # Another worker with the default grace keeps a dependency image that young
    # (it might be the base of a build still running elsewhere).
    careful = DockerImageBuilder(docker, labels=docker_cleanup.labels)
    await prepare(careful, f"{unique}-one", EXAMPLES / "user-events-python")  # its own too
    assert await careful.retire(f"{unique}-one", keep=[]) == [one.image]
    assert docker_engine.client.images.get(str(one.dependency_image))
    assert await builder.collect_dependency_images() == [f"{one.dependency_image}:latest"]
    selector = [f"{TEST_ID_LABEL}={unique}", "relay.type=dependency"]
    dep_images = docker_engine.client.images.list(filters={"label": selector})
    dep_tags = {tag for image in dep_images for tag in image.tags}
    assert dep_tags == {f"{two.dependency_image}:latest"}  # one's went; two's is used
    assert docker_engine.client.images.get(lookalike)


async def test_concurrent_prepares_all_build(
    builder: DockerImageBuilder,
    tmp_path: Path,
    unique: str,
    docker_cleanup: DockerCleanup,
) -> None:
    results: list[FunctionImage] = []

    async def one(index: int) -> None:
        directory = copy_function(EXAMPLES / "welcome-email-node", tmp_path, f"fn{index}")
        (directory / "n.txt").write_text(str(index))
        results.append(await prepare(builder, f"{unique}-c{index}", directory))

    async with anyio.create_task_group() as tg:
        for index in range(3):
            tg.start_soon(one, index)
    assert len({r.image for r in results}) == 3
    assert all(r.built for r in results)


def _fields(image: FunctionImage) -> dict[str, Any]:
    return {field: getattr(image, field) for field in image.__struct_fields__}
