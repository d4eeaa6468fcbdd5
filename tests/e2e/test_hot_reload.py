"""Editing a running function's handler: the next event is served by the new code,
without a restart; a broken edit keeps the old version serving."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import run_relay, send_event

pytestmark = pytest.mark.e2e

TEMPLATE = """\
runtime: python3.14
events:
  - handler: greet.handler
    pattern:
      kind: [greet]
"""


def handler(version: str) -> str:
    return f"def handler(event):\n    print('greeting from {version}')\n"


def test_an_edited_handler_serves_the_next_event_without_a_restart(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
) -> None:
    fn = functions_dir / "greeter"
    fn.mkdir()
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "greet.py").write_text(handler("v1"))
    worker = relay_worker()
    stream = worker_env["REDIS_STREAM"]

    send_event(sync_redis, stream, {"kind": "greet"})
    worker.wait_for(r": greeting from v1$")

    (fn / "greet.py").write_text(handler("v2"))
    # A second prepared version, built now or reused from an earlier run (content-addressed).
    worker.wait_for(r"msg=function_prepared function=greeter ", count=2, timeout=60)
    send_event(sync_redis, stream, {"kind": "greet"})
    worker.wait_for(r": greeting from v2$")

    # A broken template keeps v2 serving, and inspect says why the reconcile failed.
    (fn / "template.yaml").write_text(TEMPLATE.replace("timeout", "x") + "concurrency: 0\n")
    worker.wait_for(r"msg=function_reconcile_failed function=greeter", timeout=60)
    send_event(sync_redis, stream, {"kind": "greet"})
    worker.wait_for(r": greeting from v2$", count=2)
    inspect = run_relay(["function", "inspect", "greeter"], worker.admin_env)
    assert inspect.returncode == 0, inspect.stderr
    assert "Status:          ready" in inspect.stdout
    assert "Last reconcile:  failed" in inspect.stdout
    assert "concurrency" in inspect.stdout
    assert worker.stop() == 0
