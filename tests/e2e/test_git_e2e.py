"""Git sync end to end: a real ``relay start`` serves functions synced from a real
SSH git server, a signed GitHub webhook delivery updates them, a CLI sync while
the worker runs is picked up by its watcher, and the webhook's start-up rules."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import urllib.request
from pathlib import Path

import pytest
import redis

from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import run_relay, send_event
from tests.gitbed import GitServer

pytestmark = [pytest.mark.e2e, pytest.mark.git]

TEMPLATE = """\
runtime: python3.14
events:
  - handler: greet.handler
    pattern:
      kind: [greet]
"""


def handler(version: str) -> str:
    return f"def handler(event):\n    print('greeting from {version}')\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def deliver(port: int, body: bytes, secret: str, delivery: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/github",
        data=body,
        method="POST",
        headers={
            "X-GitHub-Event": "push",
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": "sha256="
            + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


def metric(port: int, line_start: str) -> str | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text: str = r.read().decode()
        for line in text.splitlines():
            if line.startswith(line_start):
                return line
    return None


def test_a_pushed_commit_is_served_after_a_signed_webhook_and_a_cli_sync_while_running(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
    git_server: GitServer,
    tmp_path: Path,
) -> None:
    admin = {"RELAY_STATE_DIR": str(tmp_path / "relay-state")}  # the worker's too
    keygen = run_relay(["git", "keygen"], admin)
    assert keygen.returncode == 0, keygen.stderr
    git_server.authorize(keygen.stdout.strip().splitlines()[-1])
    assert run_relay(["secret", "set", "hook"], admin, stdin="hook-secret").returncode == 0
    repo = git_server.repo()
    repo.commit({"greeter/template.yaml": TEMPLATE, "greeter/greet.py": handler("v1")})
    assert run_relay(["git", "set", repo.url, "--webhook-secret", "hook"], admin).returncode == 0
    synced = run_relay(["git", "sync", "--functions", str(functions_dir)], admin)
    assert synced.returncode == 0, synced.stderr
    assert "Trusted new host" in synced.stdout

    hook_port, metrics_port = free_port(), free_port()
    worker = relay_worker(env={**admin, "GIT_WEBHOOK_ADDR": f"127.0.0.1:{hook_port}",
                               "METRICS_ADDR": f"127.0.0.1:{metrics_port}"})
    listening = worker.wait_for(r"msg=git_webhook_listening")[0]
    assert f'detail="Webhook http server listening on 127.0.0.1:{hook_port}"' in listening
    assert worker.find(r"msg=git_webhook_unauthenticated") == []
    stream = worker_env["REDIS_STREAM"]
    send_event(sync_redis, stream, {"kind": "greet"})
    worker.wait_for(r": greeting from v1$")

    # merge to main -> GitHub delivers a push -> live
    v2 = repo.commit({"greeter/greet.py": handler("v2")})
    body = json.dumps({"ref": "refs/heads/main", "after": v2,
                       "repository": {"ssh_url": repo.url}}).encode()
    assert deliver(hook_port, body, "hook-secret", "delivery-1") == 202
    worker.wait_for(rf"msg=git_sync_succeeded commit={v2} ", timeout=60)
    worker.wait_for(r"msg=function_prepared function=greeter ", count=2, timeout=120)
    send_event(sync_redis, stream, {"kind": "greet"})
    worker.wait_for(r": greeting from v2$")

    # a CLI sync while the worker runs is sent to it (SyncGit over the control
    # socket), and the watcher picks up what it changed (here: a removal)
    gone = repo.commit({}, remove=("greeter",))
    synced = run_relay(["git", "sync", "--functions", str(functions_dir)], worker.admin_env)
    assert synced.returncode == 0, synced.stderr
    assert "removed: greeter" in synced.stdout
    worker.wait_for(r"msg=git_sync_started trigger=cli")
    worker.wait_for(r"msg=function_removed function=greeter", timeout=60)

    health = run_relay(["health"], worker.admin_env)
    assert health.returncode == 0, health.stderr
    assert health.stdout.splitlines()[0] == "ok"
    assert health.stdout.splitlines()[1].startswith(f"git: commit {gone}; last sync ")
    assert metric(metrics_port, 'git_syncs_total{outcome="success"}') == (
        'git_syncs_total{outcome="success"} 2.0'  # the webhook's and the CLI's, both the worker's
    )
    assert metric(metrics_port, 'git_webhook_deliveries_total{outcome="accepted"}') == (
        'git_webhook_deliveries_total{outcome="accepted"} 1.0'
    )
    assert worker.stop() == 0


def test_the_webhook_is_opt_in_twice_and_a_taken_port_is_fatal(
    relay_worker: WorkerFactory, tmp_path: Path
) -> None:
    port = free_port()
    # an address but no git source: nothing is bound, and the log says why
    quiet = relay_worker(name="a", env={"GIT_WEBHOOK_ADDR": f"127.0.0.1:{port}"})
    assert quiet.find(r"msg=git_webhook_disabled reason=\"no git source is configured")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # free: the disabled webhook bound nothing
    assert quiet.stop() == 0

    configured = {"RELAY_STATE_DIR": str(tmp_path / "relay-state")}
    assert run_relay(["git", "set", "git@github.com:acme/functions.git"],
                     configured).returncode == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        doomed = relay_worker(
            name="b", env={**configured, "GIT_WEBHOOK_ADDR": f"127.0.0.1:{port}"}, wait=False
        )
        assert doomed.process is not None
        code = doomed.process.wait(timeout=120)
    assert code == 1
    doomed.stop()  # drains the output
    failures = doomed.find(rf"^relay: GIT_WEBHOOK_ADDR 127.0.0.1:{port}: cannot listen \(")
    assert len(failures) == 1, "\n".join(doomed.output()[-10:])
    assert doomed.find("Traceback") == []
