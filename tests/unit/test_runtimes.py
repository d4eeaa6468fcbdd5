"""The runtime registry's planners and the Dockerfile/context rendering (pure)."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from relay.adapters.docker import pins
from relay.adapters.docker.bootstraps import bootstrap_command, bootstrap_source
from relay.adapters.docker.dockerfiles import (
    app_files,
    dependency_context,
    function_context,
    render_dependency_dockerfile,
    render_function_dockerfile,
)
from relay.adapters.docker.runtimes import (
    INJECTED_PACKAGE_JSON,
    RUNTIMES,
    bundled_output,
    plan_node_dependencies,
    plan_node_function,
    plan_python_dependencies,
    resolve_node_module,
)
from relay.domain.errors import BuildError

PY = RUNTIMES["python3.14"]
NODE = RUNTIMES["node24"]


# --- python ------------------------------------------------------------------------
def test_python_without_manifests_installs_nothing() -> None:
    plan = plan_python_dependencies({"handler.py": b""})
    assert (plan.kind, plan.manifests, plan.install) == ("none", (), None)


def test_python_requirements() -> None:
    plan = plan_python_dependencies({"requirements.txt": b"six\n"})
    assert plan.kind == "requirements"
    assert plan.manifests == (("requirements.txt", b"six\n"),)
    assert plan.install is not None
    assert "uv pip install --system --no-cache -r" in plan.install


def test_python_native_project_is_authoritative_over_requirements() -> None:
    files = {"pyproject.toml": b"p", "uv.lock": b"l", "requirements.txt": b"r"}
    plan = plan_python_dependencies(files)
    assert plan.kind == "uv-lock"
    assert [name for name, _ in plan.manifests] == ["pyproject.toml", "uv.lock"]
    assert plan.install is not None
    assert "uv export --locked --no-dev --no-emit-project" in plan.install
    assert "uv pip install --system" in plan.install


def test_python_requirements_beside_an_unrelated_pyproject_is_fine() -> None:
    plan = plan_python_dependencies({"pyproject.toml": b"[tool.ruff]", "requirements.txt": b""})
    assert plan.kind == "requirements"


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"uv.lock": b""}, "uv.lock without pyproject.toml"),
        ({"uv.lock": b"", "requirements.txt": b""}, "uv.lock without pyproject.toml"),
        ({"pyproject.toml": b""}, "pyproject.toml without uv.lock"),
    ],
)
def test_incomplete_python_project_is_an_error(files: dict[str, bytes], message: str) -> None:
    with pytest.raises(BuildError, match=message):
        plan_python_dependencies(files)


def test_nested_manifests_are_not_dependency_manifests() -> None:
    assert plan_python_dependencies({"sub/requirements.txt": b"x"}).kind == "none"


# --- node --------------------------------------------------------------------------
def test_node_dependency_plans() -> None:
    assert plan_node_dependencies({}).kind == "none"
    install = plan_node_dependencies({"package.json": b"{}"})
    assert install.kind == "npm-install"
    assert install.install is not None
    assert install.install.startswith("npm install --omit=dev")
    ci = plan_node_dependencies({"package.json": b"{}", "package-lock.json": b"{}"})
    assert ci.kind == "npm-ci"
    assert ci.install is not None
    assert ci.install.startswith("npm ci --omit=dev")
    with pytest.raises(BuildError, match=r"package-lock\.json without package\.json"):
        plan_node_dependencies({"package-lock.json": b"{}"})


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"handler.mjs", "handler.js"}, "handler.mjs"),
        ({"handler.js", "handler/index.mjs"}, "handler.js"),
        ({"handler/index.mjs", "handler/index.js"}, "handler/index.mjs"),
        ({"handler/index.js"}, "handler/index.js"),
        ({"handler.mts", "handler.ts"}, "handler.mts"),
        ({"handler.ts", "handler/index.mts"}, "handler.ts"),
        ({"handler/index.ts"}, "handler/index.ts"),
    ],
)
def test_node_module_candidates_in_order(files: set[str], expected: str) -> None:
    assert resolve_node_module("handler", files) == expected


def test_nested_module_path() -> None:
    assert resolve_node_module("src.jobs.daily", {"src/jobs/daily.ts"}) == "src/jobs/daily.ts"


def test_a_module_with_both_javascript_and_typescript_is_ambiguous() -> None:
    with pytest.raises(BuildError, match=r"'src.handler' is ambiguous: both src/handler.js and"):
        resolve_node_module("src.handler", {"src/handler.js", "src/handler/index.ts"})


def test_a_missing_module_names_every_candidate() -> None:
    with pytest.raises(BuildError) as caught:
        resolve_node_module("src.handler", {"other.js"})
    message = str(caught.value)
    for candidate in ("src/handler.mjs", "src/handler/index.js", "src/handler/index.ts"):
        assert candidate in message


def test_bundled_output_is_beside_the_source() -> None:
    assert bundled_output("src/handler.ts") == "src/handler.mjs"
    assert bundled_output("src/handler.mts") == "src/handler.mjs"
    assert bundled_output("h/index.ts") == "h/index.mjs"


def test_javascript_function_gets_an_esm_package_json_only_when_missing() -> None:
    plan = plan_node_function({"handler.js": b""}, ("handler",))
    assert plan.injected == (("package.json", INJECTED_PACKAGE_JSON),)
    assert json.loads(INJECTED_PACKAGE_JSON) == {"type": "module"}
    assert plan.build is None
    own = plan_node_function({"handler.js": b"", "package.json": b"{}"}, ("handler",))
    assert own.injected == ()


def test_typescript_handlers_are_bundled_once_with_the_pinned_esbuild() -> None:
    files = {"src/a.ts": b"", "b/index.mts": b"", "c.js": b"", "tsconfig.json": b"{}"}
    plan = plan_node_function(files, ("src.a", "b", "c", "src.a"))
    assert plan.build is not None
    assert plan.build.count("esbuild@" + pins.ESBUILD_VERSION) == 1
    assert "b/index.mts src/a.ts --bundle" in plan.build
    assert "--packages=external" in plan.build
    assert "--tsconfig=tsconfig.json" in plan.build
    assert "--out-extension:.js=.mjs" in plan.build
    assert plan.build.rstrip().endswith("/root/.npm /tmp/node-compile-cache")
    assert plan.notes == ("b/index.mts -> b/index.mjs", "src/a.ts -> src/a.mjs")


def test_handler_resolution_errors_surface_from_the_plan() -> None:
    with pytest.raises(BuildError, match="not found"):
        plan_node_function({"x.js": b""}, ("handler",))


# --- rendering ---------------------------------------------------------------------
def test_python_dependency_dockerfile_copies_the_pinned_uv() -> None:
    text = render_dependency_dockerfile(PY, plan_python_dependencies({}))
    assert text.splitlines()[0] == f"FROM {pins.PYTHON_BASE_IMAGE}"
    assert f"COPY --from={pins.UV_IMAGE} /uv /uvx /bin/" in text
    assert "RUN" not in text
    plan = plan_python_dependencies({"requirements.txt": b""})
    with_deps = render_dependency_dockerfile(PY, plan)
    assert "COPY requirements.txt /tmp/relay-deps/" in with_deps
    assert 'RUN ["/bin/sh", "-c", "uv pip install' in with_deps


def test_node_dependency_dockerfile_installs_into_app() -> None:
    plan = plan_node_dependencies({"package.json": b"{}", "package-lock.json": b"{}"})
    text = render_dependency_dockerfile(NODE, plan)
    assert text.splitlines()[0] == f"FROM {pins.NODE_BASE_IMAGE}"
    assert "WORKDIR /app" in text
    assert "COPY package.json package-lock.json /app/" in text


def test_runtime_environment_and_workdir_live_in_the_dependency_image() -> None:
    text = render_dependency_dockerfile(PY, plan_python_dependencies({}))
    assert 'ENV PYTHONDONTWRITEBYTECODE="1" PYTHONUNBUFFERED="1"' in text.splitlines()
    assert "WORKDIR /app" in text.splitlines()


def test_stage_labels_follow_from() -> None:
    labels = {"relay.type": "function-stage", "relay.function": "f"}
    text = render_function_dockerfile("dep", plan_node_function({}, ()), ["x"], labels)
    assert text.splitlines()[1] == 'LABEL relay.function="f" relay.type="function-stage"'
    dep = render_dependency_dockerfile(NODE, plan_node_dependencies({}), {"relay.type": "s"})
    assert dep.splitlines()[1] == 'LABEL relay.type="s"'


def test_function_dockerfile_is_one_copy_and_the_command() -> None:
    text = render_function_dockerfile(
        "relay-dep-python3.14-abc", plan_node_function({}, ()), ["python", "-u", "/relay/b.py"]
    )
    assert text.splitlines() == [
        "FROM relay-dep-python3.14-abc",
        "COPY root/ /",
        'CMD ["python", "-u", "/relay/b.py"]',
    ]
    ts = render_function_dockerfile(
        "dep", plan_node_function({"h.ts": b""}, ("h",)), ["node", "/relay/bootstrap.mjs"]
    )
    assert ts.splitlines()[2].startswith('RUN ["/bin/sh", "-c", "set -e && npm install')


def test_app_files_leave_out_the_template_and_add_injected_files() -> None:
    plan = plan_node_function({"handler.js": b""}, ("handler",))
    files = app_files([("template.yaml", b"t"), ("handler.js", b"h")], plan)
    assert files == {"handler.js": b"h", "package.json": INJECTED_PACKAGE_JSON}


def test_contexts_are_tars_readable_by_everyone() -> None:
    data = function_context("FROM x\n", {"a/b.py": b"1", "c.txt": b"2"}, "/relay/boot.py", b"b")
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        members = {m.name: m for m in archive.getmembers()}
    assert set(members) == {
        "Dockerfile",
        "root",
        "root/app",
        "root/relay",
        "root/relay/boot.py",
        "root/app/a",
        "root/app/a/b.py",
        "root/app/c.txt",
    }
    for member in members.values():
        assert member.uid == 0
        assert member.mode == (0o755 if member.isdir() else 0o644)
    dep = dependency_context("FROM y\n", plan_python_dependencies({"requirements.txt": b"six"}))
    with tarfile.open(fileobj=io.BytesIO(dep)) as archive:
        assert sorted(archive.getnames()) == ["Dockerfile", "requirements.txt"]


def test_every_runtime_has_a_bootstrap_and_a_pinned_base() -> None:
    for name, runtime in RUNTIMES.items():
        assert runtime.name == name
        assert runtime.base_image in (pins.PYTHON_BASE_IMAGE, pins.NODE_BASE_IMAGE)
        path, data = bootstrap_source(name)
        assert path.startswith("/relay/")
        assert data
        assert bootstrap_command(name)[-1] == path
