"""The handler's context through the real CLI: ``relay function invoke`` and
``relay dlq replay`` on a real ``relay start`` worker with real containers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import redis

from relay.adapters.redis.keys import dlq_key
from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import RelayWorker, run_relay

pytestmark = pytest.mark.e2e

FUNCTION = "context-e2e"
TEMPLATE = """\
runtime: python3.14
events:
  - handler: jobs.show.handler
    pattern:
      kind: [show]
"""
HANDLER = """\
import json
import os

NAMES = ("RELAY_MESSAGE_ID", "RELAY_ATTEMPT", "RELAY_DEADLINE", "RELAY_OCCURRENCE_ID")


def handler(event):
    print("context " + json.dumps({name: os.environ.get(name) for name in NAMES}), flush=True)
"""


def write_function(functions: Path) -> None:
    fn = functions / FUNCTION
    (fn / "jobs").mkdir(parents=True)
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "jobs" / "show.py").write_text(HANDLER)


def contexts(worker: RelayWorker) -> list[dict[str, Any]]:
    found = []
    for line in worker.find(r"jobs\.show\.handler.*: context \{"):
        found.append(json.loads(line.split(": context ", 1)[1]))
    return found


def seed(client: Any, stream: str) -> str:
    fields = {
        "original_stream": stream,
        "original_id": "1700000000000-7",
        "group": "g",
        "consumer": "w",
        "event": json.dumps({"kind": "show"}),
        "reason": "exhausted",
        "function": FUNCTION,
        "handler": "jobs.show.handler",
        "deliveries": "5",
        "handler_attempts": "5",
        "timestamp": "2026-01-01T00:00:00.000Z",
    }
    return str(client.xadd(dlq_key(stream), fields).decode())


def test_invoke_and_replay_tell_the_handler_what_they_are(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    sync_redis: redis.Redis,
    worker_env: dict[str, str],
) -> None:
    write_function(functions_dir)
    worker = relay_worker()
    invoked = run_relay(
        ["function", "invoke", FUNCTION, "--event", '{"kind": "show"}'],
        worker.admin_env,
        timeout=120,
    )
    assert invoked.returncode == 0, invoked.stderr
    entry_id = seed(sync_redis, worker_env["REDIS_STREAM"])
    replayed = run_relay(["dlq", "replay", entry_id], worker.admin_env, timeout=120)
    assert replayed.returncode == 0, replayed.stderr
    worker.wait_for(r"jobs\.show\.handler.*: context \{", count=2)
    invoke, replay = contexts(worker)
    assert re.fullmatch(r"invoke-[0-9a-f]{16}", invoke["RELAY_MESSAGE_ID"])
    assert (invoke["RELAY_ATTEMPT"], invoke["RELAY_OCCURRENCE_ID"]) == ("1", None)
    # the original message once more, one attempt past the five recorded
    assert (replay["RELAY_MESSAGE_ID"], replay["RELAY_ATTEMPT"]) == ("1700000000000-7", "6")
    for seen in (invoke, replay):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", seen["RELAY_DEADLINE"])
