"""Service containers across worker lifetimes, with the real ``relay start``.

A SIGKILLed worker leaves its replicas running; the next start keeps those that
still match (no needless restart) and removes those of a function deleted while
it was down. A graceful stop removes the worker's service containers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import docker
import pytest

from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import EXAMPLES, copy_function, wait_until

pytestmark = pytest.mark.e2e


def _replicas(client: docker.DockerClient, hostname: str) -> dict[str, set[str]]:
    """Running service container ids of the worker, by function."""
    found: dict[str, set[str]] = {}
    labels = ["relay.type=service", f"relay.hostname={hostname}"]
    for container in client.containers.list(filters={"label": labels}):
        found.setdefault(container.labels["relay.function"], set()).add(str(container.id))
    return found


def test_a_restart_keeps_matching_replicas_and_sweeps_a_deleted_functions(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    docker_client: docker.DockerClient,
    tmp_path: Path,
) -> None:
    hostname = worker_env["RELAY_HOSTNAME"]
    state = {"RELAY_STATE_DIR": str(tmp_path / "state")}  # one state dir: the same env key
    copy_function(EXAMPLES / "users-api-node", functions_dir)
    doomed = copy_function(EXAMPLES / "custom-build-service", functions_dir, "doomed")
    first = relay_worker(name="first", env=state)
    before = _replicas(docker_client, hostname)
    assert len(before.get("users-api-node", ())) == 2
    assert len(before.get("doomed", ())) == 1

    first.kill()  # SIGKILL: no graceful stop, the replicas keep running
    assert _replicas(docker_client, hostname) == before
    shutil.rmtree(doomed)

    second = relay_worker(name="second", env=state)
    after = _replicas(docker_client, hostname)
    assert after == {"users-api-node": before["users-api-node"]}

    assert second.stop() == 0
    wait_until(
        lambda: _replicas(docker_client, hostname) == {},
        30,
        "the graceful stop to remove the worker's service containers",
    )
