"""``relay dlq replay --function F ...`` and ``DLQ_RETENTION`` against a real
``relay start`` worker, real containers and a real broker (Redis, and the
embedded SQLite broker).

The rate cap is checked as a lower bound the limiter guarantees (n replays at R/s
cannot finish before (n - 1) / R seconds), not as a speed.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from relay.adapters.redis.keys import dlq_key
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock
from tests.e2e.conftest import WorkerFactory
from tests.e2e.failure_support import FUNCTION, marks, write_function
from tests.e2e.harness import run_relay

pytestmark = pytest.mark.e2e

HOUR_MS = 3_600_000


def entry(handler: str, function: str = FUNCTION) -> dict[str, str]:
    return {
        "original_stream": "events",
        "original_id": "1700000000000-0",
        "group": "g",
        "consumer": "w",
        "event": json.dumps({"kind": "ok"}),
        "reason": "exhausted",
        "function": function,
        "handler": handler,
        "deliveries": "3",
        "handler_attempts": "3",
        "timestamp": "2026-01-01T00:00:00.000Z",
    }


def dlq_ids(client: Any, stream: str) -> list[str]:
    return [entry_id.decode() for entry_id, _ in client.xrange(dlq_key(stream))]


def test_a_bulk_replay_of_200_entries_is_paced_and_deletes_exactly_the_replayed_ones(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    sync_redis: redis.Redis,
    worker_env: dict[str, str],
) -> None:
    write_function(functions_dir)
    worker = relay_worker()
    stream, key = worker_env["REDIS_STREAM"], dlq_key(worker_env["REDIS_STREAM"])
    old_ms = int(time.time() * 1000) - 2 * HOUR_MS
    pipe = sync_redis.pipeline()
    for n in range(5):  # the function's own entries, but older than --since: untouched
        pipe.xadd(key, entry("ft.marks.echo"), id=f"{old_ms + n}-0")  # type: ignore[arg-type]
    for _ in range(5):  # another function's entries: untouched
        pipe.xadd(key, entry("other.handler", function="other-fn"))  # type: ignore[arg-type]
    for n in range(200):  # selected: 185 succeed on replay, 15 fail again
        handler = "ft.marks.always_fail" if n % 13 == 0 else "ft.marks.echo"
        pipe.xadd(key, entry(handler))  # type: ignore[arg-type]
    pipe.execute()
    before = dlq_ids(sync_redis, stream)
    untouched = before[:10]
    selected = before[10:]
    stored: Any = sync_redis.xrange(key)
    fields = {eid.decode(): f for eid, f in stored}
    failing = [i for i in selected if fields[i][b"handler"] == b"ft.marks.always_fail"]
    assert (len(selected), len(failing)) == (200, 16)

    rate = 50.0
    started = time.monotonic()
    done = run_relay(
        ["dlq", "replay", "--function", FUNCTION, "--since", "1h", "--rate", f"{rate:g}/s"],
        worker.admin_env,
        timeout=300,
    )
    elapsed = time.monotonic() - started

    assert done.returncode == 1, done.stderr  # some failed again: not a clean success
    assert done.stdout.strip().startswith(
        "Replayed 184, failed again 16, skipped 0 of 200 selected in "
    ), done.stdout
    assert elapsed >= (200 - 1) / rate
    assert "Traceback" not in done.stderr
    progress = done.stderr.splitlines()  # not a terminal: one plain line per entry
    assert len([line for line in progress if line.startswith("[")]) == 200
    assert dlq_ids(sync_redis, stream) == untouched + failing
    runs = marks(worker, "replay", "run")
    assert sorted(m.handler for m in runs) == sorted(
        [fields[i][b"handler"].decode() for i in selected]
    )


def test_dlq_retention_on_a_running_worker_expires_only_old_dead_letters(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    sync_redis: redis.Redis,
    worker_env: dict[str, str],
) -> None:
    write_function(functions_dir)
    key = dlq_key(worker_env["REDIS_STREAM"])
    now_ms = int(time.time() * 1000)
    old: Any = sync_redis.xadd(key, entry("ft.marks.echo"), id=f"{now_ms - 2 * HOUR_MS}-0")  # type: ignore[arg-type]
    fresh: Any = sync_redis.xadd(key, entry("ft.marks.echo"), id=f"{now_ms - 10 * 60_000}-0")  # type: ignore[arg-type]
    worker = relay_worker(env={"DLQ_RETENTION": "1h"})
    worker.wait_for("dead_letters_expired", timeout=60)
    remaining = dlq_ids(sync_redis, worker_env["REDIS_STREAM"])
    assert remaining == [fresh.decode()]
    assert old.decode() not in remaining


def test_bulk_replay_and_retention_on_the_embedded_broker(
    relay_worker: WorkerFactory, functions_dir: Path, tmp_path: Path
) -> None:
    write_function(functions_dir)
    path = tmp_path / "broker.sqlite3"
    BrokerStore(path, SystemClock()).close()
    now_ms = int(time.time() * 1000)
    rows = [
        (now_ms - 2 * HOUR_MS, "ft.marks.echo"),  # older than DLQ_RETENTION
        (now_ms - 1000, "ft.marks.echo"),
        (now_ms - 999, "ft.marks.always_fail"),
        (now_ms - 998, "ft.marks.echo"),
    ]
    conn = sqlite3.connect(path)
    with conn:
        for at, handler in rows:
            conn.execute(
                "INSERT INTO dlq (created_ms, original_stream, original_id, grp, consumer, event,"
                " reason, function, handler, deliveries, handler_attempts, timestamp)"
                " VALUES (?, 'events', '1-0', 'relay', 'w', ?, 'exhausted', ?, ?, 3, 3, '')",
                (at, json.dumps({"kind": "ok"}), FUNCTION, handler),
            )
    conn.close()
    broker = {"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(path)}
    worker = relay_worker(env={**broker, "DLQ_RETENTION": "1h"})
    worker.wait_for("dead_letters_expired", timeout=60)
    env = {**worker.admin_env, **broker}
    done = run_relay(["dlq", "replay", "--function", FUNCTION, "--rate", "20/s"], env, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("Replayed 2, failed again 1, skipped 0 of 3 selected"), (
        done.stdout
    )
    listed = run_relay(["dlq", "ls", "--json"], env)
    document = json.loads(listed.stdout)
    assert [(e["handler"], e["written_at"] != "") for e in document["entries"]] == [
        ("ft.marks.always_fail", True)
    ]
    assert sorted(m.handler for m in marks(worker, "replay", "run")) == [
        "ft.marks.always_fail",
        "ft.marks.echo",
        "ft.marks.echo",
    ]
