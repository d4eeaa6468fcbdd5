"""The selection flags of ``relay dlq ls|rm|replay``, ``--json``, ``rm --before`` and
``DLQ_RETENTION``, as an operator runs them: real Redis, and the embedded SQLite
broker for the selection and the retention.

Entries are seeded with explicit ids so their written time is known (an entry's
written time is its id's milliseconds on both brokers).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from relay.adapters.redis.dlq_reader import RedisDeadLetterReader
from relay.adapters.sqlite.broker.dlq import SqliteDeadLetterReader
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock
from relay.application.dlq_retention import DeadLetterRetention
from relay.domain.durations import HOUR
from tests.json_schemas import assert_matches_schema

pytestmark = pytest.mark.redis

RELAY = str(Path(sys.executable).parent / "relay")
MINUTE_MS = 60_000
HOUR_MS = 3_600_000


def fields(
    function: str = "fn", handler: str = "fn.h", reason: str = "exit status 1"
) -> dict[str, str]:
    return {
        "original_stream": "events",
        "original_id": "1700000000000-0",
        "group": "relay",
        "consumer": "worker-1",
        "event": json.dumps({"n": 1}),
        "reason": reason,
        "function": function,
        "handler": handler,
        "deliveries": "5",
        "handler_attempts": "5",
        "timestamp": "2026-01-02T03:04:05Z",
    }


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url, decode_responses=True)
    yield conn
    conn.close()


@pytest.fixture
def stream(client: redis.Redis) -> Iterator[str]:
    name = f"test-dlqb-{uuid.uuid4().hex[:12]}"
    yield name
    client.delete(f"relay:{name}:dlq")


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"  # no state database: only the DLQ names functions


def seed(client: redis.Redis, stream: str, at_ms: int, **kw: str) -> str:
    return str(client.xadd(f"relay:{stream}:dlq", fields(**kw), id=f"{at_ms}-0"))  # type: ignore[arg-type]


def dlq_ids(client: redis.Redis, stream: str) -> list[str]:
    entries: Any = client.xrange(f"relay:{stream}:dlq")
    return [entry_id for entry_id, _ in entries]


def relay(
    env_extra: dict[str, str], *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_"))}
    env |= env_extra
    return subprocess.run(
        [RELAY, "dlq", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def env(redis_url: str, stream: str, state_dir: Path, tmp_path: Path) -> dict[str, str]:
    run_dir = Path("/tmp") / f"relay-dlqb-{uuid.uuid4().hex[:8]}"  # short: a socket path
    return {
        "REDIS_URI": redis_url,
        "REDIS_STREAM": stream,
        "REDIS_GROUP": "relay",
        "RELAY_STATE_DIR": str(state_dir),
        "RELAY_RUN_DIR": str(run_dir),
    }


@pytest.fixture
def world(client: redis.Redis, stream: str) -> dict[str, str]:
    """Five entries: two functions, two handlers, three ages, two reasons."""
    now = int(time.time() * 1000)
    return {
        "old_h": seed(client, stream, now - 3 * HOUR_MS),
        "old_other": seed(client, stream, now - 3 * HOUR_MS + 1, function="other", handler="o.h"),
        "mid_g": seed(client, stream, now - 30 * MINUTE_MS, handler="fn.g", reason="timed out"),
        "new_h": seed(client, stream, now - MINUTE_MS),
        "new_other": seed(client, stream, now - MINUTE_MS + 1, function="other", handler="o.h"),
    }


def listed(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 0, result.stderr
    document = assert_matches_schema(result.stdout)
    return [entry["id"] for entry in document["entries"]]


def test_ls_selects_by_function_handler_time_and_reason(
    env: dict[str, str], world: dict[str, str]
) -> None:
    w = world
    assert listed(relay(env, "ls", "--json", "--function", "fn")) == [
        w["new_h"],
        w["mid_g"],
        w["old_h"],
    ]
    assert listed(relay(env, "ls", "--json", "--function", "fn", "--handler", "fn.h")) == [
        w["new_h"],
        w["old_h"],
    ]
    assert listed(relay(env, "ls", "--json", "--since", "1h")) == [
        w["new_other"],
        w["new_h"],
        w["mid_g"],
    ]
    assert listed(relay(env, "ls", "--json", "--until", "2h", "--oldest-first")) == [
        w["old_h"],
        w["old_other"],
    ]
    assert listed(relay(env, "ls", "--json", "--reason", "TIMED")) == [w["mid_g"]]
    text = relay(env, "ls", "--function", "other")
    assert [line.split()[0] for line in text.stdout.splitlines()[1:-1]] == [
        w["new_other"],
        w["old_other"],
    ]
    assert text.stdout.splitlines()[-1] == "(2 of 5 entries selected)"


def test_ls_and_inspect_json_match_their_schemas(
    env: dict[str, str], client: redis.Redis, stream: str, world: dict[str, str]
) -> None:
    document = assert_matches_schema(relay(env, "ls", "--json", "--limit", "2").stdout)
    assert document["schema"] == "relay.dlq.ls/1"
    assert (document["total"], document["matched"], len(document["entries"])) == (5, 5, 2)
    first = document["entries"][0]
    assert (first["id"], first["function"], first["handler_attempts"]) == (
        world["new_other"],
        "other",
        5,
    )
    assert first["replayable"] is True
    inspected = relay(env, "inspect", world["mid_g"], "--json")
    assert inspected.returncode == 0, inspected.stderr
    body = assert_matches_schema(inspected.stdout)
    assert body["schema"] == "relay.dlq.inspect/1"
    assert (body["id"], body["reason"], body["event_json"]) == (
        world["mid_g"],
        "timed out",
        {"n": 1},
    )
    assert body["event"] == json.dumps({"n": 1})
    empty = relay(env, "ls", "--json", "--function", "fn", "--since", "10s")
    assert assert_matches_schema(empty.stdout)["entries"] == []


def test_bulk_rm_asks_first_and_removes_exactly_the_selection(
    env: dict[str, str], client: redis.Redis, stream: str, world: dict[str, str]
) -> None:
    everything = sorted(world.values())
    refused = relay(env, "rm", "--function", "fn", stdin="n\n")
    assert refused.returncode == 1
    assert "nothing removed" in refused.stderr
    assert sorted(dlq_ids(client, stream)) == everything
    closed_stdin = relay(env, "rm", "--function", "fn")
    assert closed_stdin.returncode == 1
    assert sorted(dlq_ids(client, stream)) == everything

    done = relay(env, "rm", "--function", "fn", "--handler", "fn.h", stdin="y\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Removed 2 entries"
    assert "Remove 2 dead-lettered entries (function fn, handler fn.h)?" in done.stderr
    assert sorted(dlq_ids(client, stream)) == sorted(
        [world["old_other"], world["mid_g"], world["new_other"]]
    )


def test_rm_before_removes_only_older_entries_and_needs_no_prompt_with_yes(
    env: dict[str, str], client: redis.Redis, stream: str, world: dict[str, str]
) -> None:
    done = relay(env, "rm", "--before", "2h", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Removed 2 entries"
    assert dlq_ids(client, stream) == [world["mid_g"], world["new_h"], world["new_other"]]
    single = relay(env, "rm", world["mid_g"])  # the single-id form, unchanged
    assert single.stdout.strip() == f"Removed {world['mid_g']}"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["ls", "--since", "yesterday"], "--since 'yesterday' is invalid"),
        (["ls", "--until", "2026-01-02T03:04:05"], "needs a zone"),
        (["ls", "--limit", "-1"], "--limit '-1' is invalid"),
        (["ls", "--function", "nope"], 'unknown function "nope"'),
        (["rm", "--function", "nope", "--yes"], 'unknown function "nope"'),
        (["rm", "--before", "soon", "--yes"], "--before 'soon' is invalid"),
        (["rm", "--yes"], "name an entry id, or select entries"),
        (["rm", "1-0", "--function", "fn"], "not both"),
        (["rm", "--since", "1h", "--until", "2h", "--yes"], "nothing can match"),
        (["replay", "--function", "fn", "--rate", "fast"], "--rate 'fast' is invalid"),
        (["replay", "--function", "fn", "--limit", "0"], "--limit '0' is invalid"),
        (["replay", "--function", "nope"], 'unknown function "nope"'),
        (["replay", "--handler", "fn.h"], "needs --function"),
    ],
)
def test_bad_selection_input_is_one_line_exit_2_and_nothing_is_deleted(
    env: dict[str, str],
    client: redis.Redis,
    stream: str,
    world: dict[str, str],
    args: list[str],
    says: str,
) -> None:
    result = relay(env, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1
    assert says in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(dlq_ids(client, stream)) == sorted(world.values())


def test_replay_dry_run_sends_nothing_and_a_missing_worker_keeps_every_entry(
    env: dict[str, str], client: redis.Redis, stream: str, world: dict[str, str]
) -> None:
    dry = relay(env, "replay", "--function", "fn", "--dry-run", "--rate", "2/s")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[:3] == [
        f"would replay {world['old_h']} (fn/fn.h)",
        f"would replay {world['mid_g']} (fn/fn.g)",
        f"would replay {world['new_h']} (fn/fn.h)",
    ]
    assert lines[3].startswith("Dry run: 3 would be replayed, 0 skipped, at 2/s (at least 1.0s)")
    no_worker = relay(env, "replay", "--function", "fn")
    assert no_worker.returncode == 1
    assert "Replayed 0, failed again 0, skipped 0 of 3 selected" in no_worker.stdout
    assert "no relay worker is running" in no_worker.stdout
    assert sorted(dlq_ids(client, stream)) == sorted(world.values())


@pytest.mark.anyio
async def test_dlq_retention_trims_only_entries_older_than_the_window_on_redis(
    redis_url: str, client: redis.Redis, stream: str, world: dict[str, str]
) -> None:
    conn = AsyncRedis.from_url(redis_url)
    try:
        keeper = DeadLetterRetention(RedisDeadLetterReader(conn, stream), HOUR, SystemClock())
        assert await keeper.trim_once() == 2
    finally:
        await conn.aclose()
    assert dlq_ids(client, stream) == [world["mid_g"], world["new_h"], world["new_other"]]


def sqlite_broker(tmp_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """A broker file with the same five entries, written straight into its table."""
    path = tmp_path / "broker.sqlite3"
    BrokerStore(path, SystemClock()).close()
    now = int(time.time() * 1000)
    rows = {
        "old_h": (now - 3 * HOUR_MS, "fn", "fn.h", "exit status 1"),
        "old_other": (now - 3 * HOUR_MS + 1, "other", "o.h", "exit status 1"),
        "mid_g": (now - 30 * MINUTE_MS, "fn", "fn.g", "timed out"),
        "new_h": (now - MINUTE_MS, "fn", "fn.h", "exit status 1"),
        "new_other": (now - MINUTE_MS + 1, "other", "o.h", "exit status 1"),
    }
    ids = {}
    with sqlite3.connect(path) as conn:
        for name, (at, fn, handler, reason) in rows.items():
            cur = conn.execute(
                "INSERT INTO dlq (created_ms, original_stream, original_id, grp, consumer, event,"
                " reason, function, handler, deliveries, handler_attempts, timestamp)"
                " VALUES (?, 'events', '1-0', 'relay', 'w', '{}', ?, ?, ?, 1, 1, '')",
                (at, reason, fn, handler),
            )
            ids[name] = f"{at}-{cur.lastrowid}"
    conn.close()
    env = {
        "RELAY_BROKER": "sqlite",
        "RELAY_BROKER_PATH": str(path),
        "REDIS_STREAM": "events",
        "REDIS_GROUP": "relay",
        "RELAY_STATE_DIR": str(tmp_path / "state"),
    }
    return env, ids


def sqlite_ids(env: dict[str, str]) -> list[str]:
    with sqlite3.connect(env["RELAY_BROKER_PATH"]) as conn:
        rows = conn.execute("SELECT created_ms, seq FROM dlq ORDER BY seq").fetchall()
    conn.close()
    return [f"{ms}-{seq}" for ms, seq in rows]


def test_selection_and_rm_before_on_the_embedded_broker(tmp_path: Path) -> None:
    env, w = sqlite_broker(tmp_path)
    assert listed(relay(env, "ls", "--json", "--function", "fn", "--handler", "fn.h")) == [
        w["new_h"],
        w["old_h"],
    ]
    assert listed(relay(env, "ls", "--json", "--since", "1h", "--reason", "timed")) == [w["mid_g"]]
    bad = relay(env, "ls", "--function", "nope")
    assert bad.returncode == 2
    assert 'unknown function "nope"' in bad.stderr
    done = relay(env, "rm", "--function", "other", "--before", "2h", "--yes")
    assert done.stdout.strip() == "Removed 1 entries", done.stderr
    assert sqlite_ids(env) == [w["old_h"], w["mid_g"], w["new_h"], w["new_other"]]


@pytest.mark.anyio
async def test_dlq_retention_on_the_embedded_broker(tmp_path: Path) -> None:
    env, w = sqlite_broker(tmp_path)
    store = BrokerStore(Path(env["RELAY_BROKER_PATH"]), SystemClock())
    try:
        keeper = DeadLetterRetention(SqliteDeadLetterReader(store), HOUR, SystemClock())
        assert await keeper.trim_once() == 2
    finally:
        store.close()
    assert sqlite_ids(env) == [w["mid_g"], w["new_h"], w["new_other"]]


class StandInWorker:
    """Answers every ``dlq_replay`` like the worker: deletes the entry, answers ok."""

    def __init__(self, path: Path, client: redis.Redis, stream: str) -> None:
        self.requests: list[str] = []
        self._client, self._stream = client, stream
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(4)
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    data += conn.recv(65536)
                entry_id = json.loads(data)["command"]["entry_id"]
                self.requests.append(entry_id)
                self._client.xdel(f"relay:{self._stream}:dlq", entry_id)
                conn.sendall(b'{"ok": true, "result": {}}\n')

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._server.close()


def test_ctrl_c_stops_a_bulk_replay_before_the_next_entry_and_reports_it(
    env: dict[str, str], client: redis.Redis, stream: str, world: dict[str, str]
) -> None:
    run_dir = Path(env["RELAY_RUN_DIR"])
    run_dir.mkdir()
    worker = StandInWorker(run_dir / "relay.sock", client, stream)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_"))}
    proc = subprocess.Popen(
        [RELAY, "dlq", "replay", "--function", "fn", "--rate", "1/m"],
        env={**child_env, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # printed once the first replay is done
        assert first.startswith(f"[1/3] replayed {world['old_h']}"), first
        proc.send_signal(signal.SIGINT)  # now waiting a minute for the next slot
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        worker.close()
        (run_dir / "relay.sock").unlink(missing_ok=True)
        run_dir.rmdir()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stdout.strip().startswith("Replayed 1, failed again 0, skipped 0 of 3 selected"), stdout
    assert "interrupted, 2 not attempted" in stdout
    assert worker.requests == [world["old_h"]]
    assert sorted(dlq_ids(client, stream)) == sorted(v for k, v in world.items() if k != "old_h")
