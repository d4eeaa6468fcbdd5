"""Issue 35.2: ``relay start`` with nothing to serve (a missing or unreadable
functions directory and no git source) refuses to start with one line, on both
brokers, instead of holding events while health and stats say all is well."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.adapters.git.files import GitPaths
from relay.adapters.git.store import GitStore
from relay.domain.git import GitSource
from tests.e2e.conftest import WorkerFactory
from tests.e2e.embedded_support import no_redis_env
from tests.e2e.harness import run_relay

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

HINT = "nothing to serve (mount it, pass --functions DIR, or configure a git source"


def _refused(env: dict[str, str], functions: Path) -> str:
    done = run_relay(["start", "--functions", str(functions)], env, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert HINT in line
    return line


def test_redis_worker_refuses_a_missing_or_unreadable_directory(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    env = {**worker_env, "RELAY_STATE_DIR": str(tmp_path / "state"),
           "RELAY_RUN_DIR": str(tmp_path / "run")}
    missing = tmp_path / "nonexistent"
    assert _refused(env, missing).startswith(
        f"relay: functions directory {missing} does not exist: "
    )
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert f"{not_a_dir} is not a directory: " in _refused(env, not_a_dir)


def test_embedded_worker_refuses_a_missing_directory(tmp_path: Path) -> None:
    env = no_redis_env(
        RELAY_BROKER="sqlite",
        RELAY_BROKER_PATH=str(tmp_path / "broker.sqlite3"),
        RELAY_STATE_DIR=str(tmp_path / "state"),
        RELAY_RUN_DIR=str(tmp_path / "run"),
    )
    missing = tmp_path / "nonexistent"
    assert _refused(env, missing).startswith(
        f"relay: functions directory {missing} does not exist: "
    )
    assert not (tmp_path / "broker.sqlite3").exists()  # refused before anything was opened


def test_a_git_source_lets_the_worker_wait_for_its_first_sync(
    relay_worker: WorkerFactory, tmp_path: Path
) -> None:
    """With a git source the directory is the sync's to create: the worker starts,
    and ``relay health`` fails naming the directory until it is there."""
    state = tmp_path / "git-state"
    GitStore(GitPaths(state)).save_source(
        GitSource(repository="git@git.invalid:team/functions.git")
    )
    functions = tmp_path / "not-synced-yet"
    worker = relay_worker(functions=functions, env={"RELAY_STATE_DIR": str(state)})
    assert worker.find(r"msg=relay_started")
    sick = run_relay(["health"], worker.admin_env)
    assert sick.returncode == 1
    assert sick.stderr.strip() == (
        f"relay: worker not ready: functions: directory {functions} does not exist: "
        "nothing to serve"
    )
    functions.mkdir()  # what the first sync does
    well = run_relay(["health"], worker.admin_env)
    assert well.returncode == 0, well.stderr
    assert well.stdout.splitlines()[0] == "ok"
