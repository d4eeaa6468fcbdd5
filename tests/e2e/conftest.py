"""Fixtures for end-to-end tests: real ``relay start`` workers on the test bed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
import redis

from tests.e2e.embedded_support import broker_file, embedded_worker  # noqa: F401 - fixtures
from tests.e2e.harness import RelayWorker

WorkerFactory = Callable[..., RelayWorker]


@pytest.fixture
def worker_env(redis_url: str, unique: str) -> dict[str, str]:
    """A stream, group and hostname of this test's own on the session Redis."""
    return {
        "REDIS_URI": redis_url,
        "REDIS_STREAM": f"events-{unique}",
        "REDIS_GROUP": f"group-{unique}",
        "RELAY_HOSTNAME": f"host-{unique}",
        "LOG_LEVEL": "DEBUG",
        # Teardown SIGTERMs each worker and waits 30 s: a shorter grace than the
        # 30 s default keeps a worker with work in flight inside that wait.
        "SHUTDOWN_GRACE": "10s",
    }


@pytest.fixture
def sync_redis(redis_url: str) -> Iterator[redis.Redis]:
    """A blocking client on the session Redis, closed after the test."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def docker_client() -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture
def functions_dir(tmp_path: Path) -> Path:
    path = tmp_path / "functions"
    path.mkdir()
    return path


@pytest.fixture
def relay_worker(
    tmp_path: Path, functions_dir: Path, worker_env: dict[str, str]
) -> Iterator[WorkerFactory]:
    """Start ``relay start`` workers; each is stopped (or killed) after the test, and any
    execution container left with the test's hostname label is removed."""
    started: list[RelayWorker] = []

    def make(
        *,
        name: str = "w",
        env: dict[str, str] | None = None,
        wait: bool = True,
        functions: Path | None = None,
    ) -> RelayWorker:
        root = tmp_path / f"worker-{name}"
        root.mkdir()
        worker = RelayWorker(root, functions or functions_dir, {**worker_env, **(env or {})})
        started.append(worker)
        return worker.start(wait=wait)

    yield make
    for worker in started:
        try:
            worker.stop(timeout=30)
        except Exception:  # a stuck worker must not leak: kill it
            worker.kill()
    client = docker.from_env()
    try:
        for host in {w.env["RELAY_HOSTNAME"] for w in started}:
            label = f"relay.hostname={host}"
            # sparse: a container auto-removed meanwhile must not fail the listing
            for container in client.containers.list(
                all=True, sparse=True, filters={"label": label}
            ):
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass
                except docker.errors.APIError as exc:  # already being removed
                    if exc.status_code != 409:
                        raise
    finally:
        client.close()
