"""The execution runtime through the real ``relay start``: secrets end to end (a
canary value searched for in everything Relay writes), and orphaned containers
of a killed worker stopping by themselves."""

from __future__ import annotations

import hashlib
import json
import socket
import urllib.request
from pathlib import Path

import docker
import pytest
import redis

from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import RelayWorker, run_relay, wait_until

pytestmark = pytest.mark.e2e

FUNCTION = "canary-secret"
TEMPLATE = """\
runtime: python3.14
env:
  PLAIN: plain-value
secrets:
  API_KEY: api-key
events:
  - handler: jobs.digest.handler
    pattern:
      kind: [digest]
"""
HANDLER = """\
import hashlib
import os


def handler(event):
    value = os.environ["API_KEY"]
    print("digest", event["n"], hashlib.sha256(value.encode()).hexdigest())
"""


def write_function(functions: Path) -> None:
    fn = functions / FUNCTION
    (fn / "jobs").mkdir(parents=True)
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "jobs" / "digest.py").write_text(HANDLER)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_secret(worker: RelayWorker, value: str) -> None:
    result = run_relay(["secret", "set", "api-key"], worker.admin_env, stdin=value)
    assert result.returncode == 0, result.stderr
    assert value not in result.stdout + result.stderr


def files_under(root: Path, skip: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and skip not in p.parents]


def test_secret_values_reach_only_the_handler(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
    unique: str,
) -> None:
    write_function(functions_dir)
    port = free_port()
    worker = relay_worker(env={"METRICS_ADDR": f"127.0.0.1:{port}"})
    canaries = [f"canary-{unique}-first", f"canary-{unique}-rotated"]
    engine = docker.from_env()
    try:
        seen_by_docker = []
        for n, canary in enumerate(canaries):
            set_secret(worker, canary)
            sync_redis.xadd(
                worker_env["REDIS_STREAM"], {"event": json.dumps({"kind": "digest", "n": n})}
            )
            digest = hashlib.sha256(canary.encode()).hexdigest()
            worker.wait_for(rf'handler "jobs.digest.handler" message "[^"]+": digest {n} {digest}$')
            label = f"relay.hostname={worker_env['RELAY_HOSTNAME']}"
            for container in engine.containers.list(filters={"label": label}):
                seen_by_docker.append(json.dumps(engine.api.inspect_container(container.id or "")))
            image = json.loads(seen_by_docker[-1])["Config"]["Image"]
            seen_by_docker.append(json.dumps(engine.api.inspect_image(image)))  # type: ignore[no-untyped-call]
            seen_by_docker.append(json.dumps(engine.api.history(image)))  # type: ignore[no-untyped-call]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            metrics_text = reply.read().decode()
        inspect = run_relay(["function", "inspect", FUNCTION], worker.admin_env)
        listed = run_relay(["secret", "ls"], worker.admin_env)
        assert "api-key" in listed.stdout
        stats = run_relay(["stats"], worker.admin_env)
        assert worker.stop() == 0
    finally:
        engine.close()
    written = [
        "\n".join(worker.output()),
        metrics_text,
        inspect.stdout + inspect.stderr,
        listed.stdout,
        stats.stdout,
        *seen_by_docker,
    ]
    state = worker.state_dir
    written += [p.read_bytes().decode("latin-1") for p in files_under(state, state / "secrets")]
    written += [p.read_bytes().decode("latin-1") for p in files_under(worker.run_dir, state)]
    assert "API_KEY=api-key" in inspect.stdout  # the reference is shown, never the value
    for canary in canaries:
        for text in written:
            assert canary not in text


def test_a_killed_workers_container_stops_by_itself(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
) -> None:
    write_function(functions_dir)
    worker = relay_worker()
    set_secret(worker, "irrelevant")
    sync_redis.xadd(worker_env["REDIS_STREAM"], {"event": json.dumps({"kind": "digest", "n": 1})})
    worker.wait_for(r"digest 1 ")
    engine = docker.from_env()
    label = f"relay.hostname={worker_env['RELAY_HOSTNAME']}"
    try:
        assert engine.containers.list(filters={"label": label}), "a warm container should run"
        worker.kill()
        # nobody removes it: its stdin closed with the killed worker, so it exits
        wait_until(
            lambda: not engine.containers.list(all=True, filters={"label": label}),
            30,
            "the orphaned container to stop by itself",
        )
    finally:
        engine.close()
