"""Relay installs from a fresh clone as a tool, the way ``pipx install .`` and
``uv tool install .`` do it: a wheel built from the clone, in a new virtual
environment holding the locked runtime set and nothing else.

The "clone" is the working tree's files that git would clone (tracked, plus new
files not ignored), so nothing the build or the run needs may come from an ignored
or generated file. The venv runs ``relay --version``, validates the examples and
publishes to an embedded broker file: it found its bootstraps, scripts and every
module in the wheel, not in the source tree.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# the run-time files that are not Python modules, each read from the package
DATA_FILES = (
    "relay/adapters/redis/lua/begin.lua",
    "relay/adapters/redis/lua/common.lua",
    "relay/adapters/docker/bootstraps/node_bootstrap.mjs",
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def run(args: list[str | Path], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    return done.stdout


def fresh_clone(target: Path) -> Path:
    listed = run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO
    )
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is not cloned
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def clean_env(**extra: str) -> dict[str, str]:
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "REDIS_", "RELAY_")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of the working tree (copied once per worker that needs it)."""
    return fresh_clone(tmp_path_factory.mktemp("install") / "clone")


@pytest.fixture(scope="module")
def installed(clone: Path) -> tuple[Path, Path]:
    """(the clone, the new venv's bin directory) with the wheel installed."""
    root = clone.parent
    dist = root / "dist"
    # no build isolation: hatchling comes from the locked set (the test bed is offline)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", dist, clone], cwd=root, env=clean_env())  # fmt: skip
    (wheel,) = dist.glob("relay-*.whl")
    venv = root / "venv"
    run([sys.executable, "-m", "venv", venv], cwd=root, env=clean_env())
    pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    run([*pip, "--require-hashes", "-r", clone / "requirements-runtime.lock"], cwd=root,
        env=clean_env())  # fmt: skip
    run([*pip, "--no-deps", wheel], cwd=root, env=clean_env())
    return clone, venv / "bin"


def test_the_wheel_carries_the_run_time_files_and_no_tests(
    installed: tuple[Path, Path],
) -> None:
    clone, _ = installed
    (wheel,) = (clone.parent / "dist").glob("relay-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in DATA_FILES:
        assert data in names
    assert not any(name.startswith(("tests/", "bench/", "relay/tests/")) for name in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Provides-Extra: test" in text
    assert "Requires-Dist: pytest>=8.0; extra == 'test'" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_the_installed_relay_runs_from_its_own_venv(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    """--version, validate on the clone's examples, publish to an embedded broker
    file: all from the venv, with the source tree out of reach (cwd elsewhere, no
    PYTHONPATH) and without the test tools."""
    clone, bin_dir = installed
    relay = bin_dir / "relay"
    env = clean_env()
    where = run([bin_dir / "python", "-c", "import relay; print(relay.__file__)"],
                cwd=tmp_path, env=env)  # fmt: skip
    assert where.startswith(str(bin_dir.parent)), where
    assert run([relay, "--version"], cwd=tmp_path, env=env).startswith("relay 0.1.0")
    examples = sorted(p.name for p in (clone / "examples" / "functions").iterdir())
    validated = run([relay, "function", "validate", clone / "examples" / "functions"],
                    cwd=tmp_path, env=env)  # fmt: skip
    assert validated.splitlines() == [f"ok {name}" for name in examples]
    broker = tmp_path / "broker.sqlite3"
    event = json.dumps({"kind": "installed"})
    published = run(
        [relay, "publish", "--event", event], cwd=tmp_path,
        env={**env, "RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(broker)},
    )
    assert published.strip()
    conn = sqlite3.connect(broker)
    try:
        assert conn.execute("SELECT payload FROM jobs").fetchall() == [(event.encode(),)]
    finally:
        conn.close()
    no_pytest = subprocess.run(
        [bin_dir / "python", "-c", "import pytest"], capture_output=True, check=False, env=env
    )
    assert no_pytest.returncode != 0, "the test tools must stay an extra"


# The two tool installers a user runs on a clone, each pinned (installed from PyPI into a
# throwaway venv of its own): they build the wheel in their own isolated environment and
# resolve the dependencies from pyproject.toml, not from the lock.
TOOLS = {"uv": "uv==0.13.8", "pipx": "pipx==1.18.4"}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_tool_installer_installs_relay_from_a_fresh_clone(
    clone: Path, tmp_path: Path, tool: str
) -> None:
    """`uv tool install CLONE` and `pipx install CLONE`, as the README says, into
    directories of this test's own: the `relay` they put on the PATH answers and
    publishes to an embedded broker file (no wheel of ours: the tool builds it)."""
    tools = tmp_path / "tools"
    run([sys.executable, "-m", "venv", tools], cwd=tmp_path, env=clean_env())
    run([tools / "bin" / "python", "-m", "pip", "install", "-q", TOOLS[tool]], cwd=tmp_path,
        env=clean_env())  # fmt: skip
    bin_dir = tmp_path / "bin"
    env = clean_env(
        UV_TOOL_DIR=str(tmp_path / "uv-tools"), UV_TOOL_BIN_DIR=str(bin_dir),
        UV_CACHE_DIR=str(tmp_path / "uv-cache"), UV_PYTHON_DOWNLOADS="never",
        PIPX_HOME=str(tmp_path / "pipx"), PIPX_BIN_DIR=str(bin_dir),
    )  # fmt: skip
    if tool == "uv":
        command: list[str | Path] = [tools / "bin" / "uv", "tool", "install",
                                     "--python", sys.executable, clone]  # fmt: skip
    else:
        command = [tools / "bin" / "pipx", "install", "--python", sys.executable, clone]
    run(command, cwd=tmp_path, env=env)
    relay = bin_dir / "relay"
    assert run([relay, "--version"], cwd=tmp_path, env=env).startswith("relay 0.1.0")
    broker = tmp_path / "broker.sqlite3"
    published = run(
        [relay, "publish", "--event", '{"kind": "tool"}'], cwd=tmp_path,
        env={**env, "RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(broker)},
    )
    assert published.strip()
