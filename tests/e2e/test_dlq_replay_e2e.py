"""``relay dlq replay`` against a real ``relay start`` worker and real containers.

Entries are seeded in the spec's flat format for the failure-table function (see
``failure_support``); the replay runs on the live worker through the control
socket, and the entry is deleted only when the handler succeeded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from relay.adapters.redis.keys import dlq_key
from tests.e2e.conftest import WorkerFactory
from tests.e2e.failure_support import FUNCTION, marks, write_function
from tests.e2e.harness import run_relay

pytestmark = pytest.mark.e2e


def seed(client: Any, stream: str, handler: str, event: object) -> str:
    fields = {
        "original_stream": stream,
        "original_id": "1700000000000-0",
        "group": "g",
        "consumer": "w",
        "event": json.dumps(event),
        "reason": "exhausted",
        "function": FUNCTION,
        "handler": handler,
        "deliveries": "3",
        "handler_attempts": "3",
        "timestamp": "2026-01-01T00:00:00.000Z",
    }
    return str(client.xadd(dlq_key(stream), fields).decode())


def dlq_ids(client: Any, stream: str) -> list[str]:
    return [entry_id.decode() for entry_id, _ in client.xrange(dlq_key(stream))]


def test_replay_runs_the_recorded_handler_on_the_worker_and_removes_the_entry_on_success(
    relay_worker: WorkerFactory,
    functions_dir: Any,
    sync_redis: redis.Redis,
    worker_env: dict[str, str],
) -> None:
    write_function(functions_dir)
    worker = relay_worker()
    stream = worker_env["REDIS_STREAM"]
    ok_id = seed(sync_redis, stream, "ft.marks.echo", {"kind": "ok", "n": 1})
    failing_id = seed(sync_redis, stream, "ft.marks.always_fail", {"kind": "fail"})

    done = run_relay(["dlq", "replay", ok_id], worker.admin_env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"Replayed {ok_id} ({FUNCTION}/ft.marks.echo); entry removed")
    assert dlq_ids(sync_redis, stream) == [failing_id]
    assert [m.handler for m in marks(worker, "replay", "run")] == ["ft.marks.echo"]

    failed = run_relay(["dlq", "replay", failing_id], worker.admin_env, timeout=120)
    assert failed.returncode == 1
    assert "this handler always fails" in failed.stderr
    assert "the entry is kept" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert dlq_ids(sync_redis, stream) == [failing_id]
    # the replay is outside delivery: nothing was added to the stream or its ledger
    assert sync_redis.xlen(stream) == 0
