"""The execution runtime through the real ``relay start``: secrets end to end (a
canary value searched for in everything Relay writes), and orphaned containers
of a killed worker stopping by themselves."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import docker
import pytest
import redis

from relay.adapters.redis.keys import dlq_key, invocation_key
from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import RELAY, RelayWorker, run_relay, send_event, wait_until
from tests.e2e.harness import text as reply_text

# One xdist worker for the whole module: its tests share one function name with
# different sources, and a worker retires the images of its functions that it does not
# serve, so a test beside another on the same engine could lose its image between the
# build and the first container (seen in a fresh-clone CI run).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("canary-secret")]

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


def test_a_secret_that_is_not_utf8_fails_the_invocation_and_its_bytes_appear_nowhere(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
    unique: str,
) -> None:
    write_function(functions_dir)
    template = functions_dir / FUNCTION / "template.yaml"
    template.write_text(TEMPLATE.replace("kind: [digest]", "kind: [digest]\n    retries: 0"))
    worker = relay_worker()
    canary = f"canary-{unique}-binary"
    # Written past `relay secret set` (which refuses it, below): a file someone
    # copied into the store, invalid UTF-8 on both sides of the canary.
    set_secret(worker, "placeholder")
    secret_file = worker.state_dir / "secrets" / "api-key"
    secret_file.write_bytes(b"\xff\xfe" + canary.encode() + b"\x80")
    os.chmod(secret_file, 0o600)
    stream, group = worker_env["REDIS_STREAM"], worker_env["REDIS_GROUP"]
    message_id = send_event(sync_redis, stream, {"kind": "digest", "n": 1})
    worker.wait_for(r"msg=message_dead_lettered")
    entries: Any = sync_redis.xrange(dlq_key(stream))
    [(raw_entry_id, raw_fields)] = entries
    entry_id = reply_text(raw_entry_id)
    dead_letter = {reply_text(k): reply_text(v) for k, v in raw_fields.items()}
    assert 'secret "api-key" is not valid UTF-8 text' in dead_letter["reason"]
    raw_ledger: Any = sync_redis.hgetall(invocation_key(stream, group, message_id))
    ledger = {reply_text(k): reply_text(v) for k, v in raw_ledger.items()}
    refused = subprocess.run(
        [RELAY, "secret", "set", "api-key"],
        env={**os.environ, **worker.admin_env},
        input=b"\xff" + canary.encode(),
        capture_output=True,
        check=False,
    )
    assert refused.returncode == 1
    assert b'secret "api-key" is not valid UTF-8 text' in refused.stderr + refused.stdout
    shown = [
        run_relay(["dlq", "ls"], worker.admin_env),
        run_relay(["dlq", "inspect", entry_id], worker.admin_env),
        run_relay(["trace", message_id], worker.admin_env),
        run_relay(["function", "inspect", FUNCTION], worker.admin_env),
    ]
    assert worker.stop() == 0
    written = [
        "\n".join(worker.output()),
        json.dumps(dead_letter),
        json.dumps(ledger),
        (refused.stdout + refused.stderr).decode("latin-1"),
        *(result.stdout + result.stderr for result in shown),
    ]
    state = worker.state_dir
    written += [p.read_bytes().decode("latin-1") for p in files_under(state, state / "secrets")]
    assert secret_file.read_bytes().startswith(b"\xff\xfe")  # the refused set changed nothing
    for text in written:
        assert canary not in text
        assert "\\xff" not in text


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
        # nobody removes it: its stdin closed with the killed worker, so it exits. sparse:
        # a full listing inspects each container and fails on one removed meanwhile.
        wait_until(
            lambda: not engine.containers.list(all=True, sparse=True, filters={"label": label}),
            30,
            "the orphaned container to stop by itself",
        )
    finally:
        engine.close()
