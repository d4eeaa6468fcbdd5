"""``relay start`` workers on the embedded broker, with no Redis anywhere: each in
its own root (state, run dir) and hostname, all sharing one broker file."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from tests.e2e.harness import RelayWorker

EmbeddedWorkers = Callable[..., RelayWorker]


def no_redis_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_")}
    return {**env, **extra}


def broker_rows(path: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """A read of the broker file beside the workers (WAL: readers never block)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


@pytest.fixture
def broker_file(tmp_path: Path) -> Path:
    return tmp_path / "broker.sqlite3"


@pytest.fixture
def embedded_worker(
    tmp_path: Path, functions_dir: Path, broker_file: Path, unique: str
) -> Iterator[EmbeddedWorkers]:
    """Start ``relay start`` workers on ``broker_file``; each is stopped (or killed)
    after the test and its execution containers are removed."""
    started: list[RelayWorker] = []

    def make(*, name: str = "w", env: dict[str, str] | None = None) -> RelayWorker:
        root = tmp_path / f"worker-{name}"
        root.mkdir()
        worker_env = {
            "RELAY_BROKER": "sqlite",
            "RELAY_BROKER_PATH": str(broker_file),
            "RELAY_HOSTNAME": f"emb-{unique}-{name}",
            "LOG_LEVEL": "DEBUG",
            "SHUTDOWN_GRACE": "10s",
            **(env or {}),
        }
        worker = RelayWorker(root, functions_dir, {})
        worker.env = {
            **no_redis_env(),
            **{k: v for k, v in worker.env.items() if not k.startswith("REDIS_")},
            **worker_env,
        }
        started.append(worker)
        return worker.start()

    yield make
    for worker in started:
        try:
            worker.stop(timeout=30)
        except Exception:  # a stuck worker must not leak: kill it
            worker.kill()
    client = docker.from_env()
    try:
        for worker in started:
            label = f"relay.hostname={worker.env['RELAY_HOSTNAME']}"
            for c in client.containers.list(all=True, sparse=True, filters={"label": label}):
                with contextlib.suppress(docker.errors.APIError):  # already going away
                    c.remove(force=True)
    finally:
        client.close()


def admin_env(worker: RelayWorker) -> dict[str, str]:
    """What an operator's shell needs for admin commands against ``worker``."""
    keep = ("RELAY_BROKER", "RELAY_BROKER_PATH", "RELAY_STATE_DIR", "RELAY_RUN_DIR")
    return no_redis_env(**{k: worker.env[k] for k in keep})
