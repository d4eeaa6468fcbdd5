"""Issue 35.1: a malformed message's DLQ entry keeps its whole payload (bytes that
are not UTF-8 included), on real Redis and on the real embedded broker, and
``relay dlq replay`` of that entry publishes exactly those bytes again."""

from __future__ import annotations

import sqlite3
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis

from relay.adapters.redis.keys import dlq_key
from relay.adapters.sqlite.broker import jobs
from relay.domain.dlq_event import EVENT_BASE64_MARK, dlq_event_bytes
from relay.domain.priority import priority_class
from relay.entrypoints.config import EMBEDDED_STREAM
from tests.e2e.conftest import WorkerFactory
from tests.e2e.embedded_support import EmbeddedWorkers, admin_env, broker_rows
from tests.e2e.harness import run_relay, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

# 1,000 levels deep: too deep for the decoder or the matcher, 2,020 bytes in all
NESTED = b'{"kind":"nest","a":' + b"[" * 1000 + b"]" * 1000 + b"}"
NOT_UTF8 = b'{"kind": "\xff\xfe"}'
NORMAL = priority_class(None)
assert len(NESTED) == 2020


def _republish(env: dict[str, str], entry_id: str) -> str:
    """``relay dlq replay`` of a malformed entry; the new message id it printed."""
    done = run_relay(["dlq", "replay", entry_id], env, timeout=60)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert line.startswith(f"Republished {entry_id} as "), line
    assert line.endswith("entry removed")
    return line.split()[3]


def test_redis_keeps_and_republishes_the_whole_payload(
    relay_worker: WorkerFactory, sync_redis: redis.Redis, worker_env: dict[str, str]
) -> None:
    worker = relay_worker()
    stream = worker_env["REDIS_STREAM"]
    client: Any = sync_redis

    def entry_of(message_id: str) -> tuple[str, dict[bytes, bytes]] | None:
        for entry_id, fields in client.xrange(dlq_key(stream)):
            if fields[b"original_id"].decode() == message_id:
                return entry_id.decode(), fields
        return None

    for payload in (NESTED, NOT_UTF8):
        message_id = client.xadd(stream, {"event": payload}).decode()
        found = wait_until(partial(entry_of, message_id), 30, "the DLQ entry")
        assert isinstance(found, tuple)
        entry_id, fields = found
        assert fields[b"function"] == b"-"
        text = fields[b"event"].decode()
        assert text.startswith(EVENT_BASE64_MARK) == (payload == NOT_UTF8)
        assert dlq_event_bytes(text) == payload

        new_id = _republish(worker.admin_env, entry_id)
        [(_, republished)] = client.xrange(stream, new_id, new_id)
        assert republished[b"event"] == payload
        assert entry_of(message_id) is None
        # the worker dead-letters the republished copy again, whole
        again = wait_until(partial(entry_of, new_id), 30, "the copy's DLQ entry")
        assert isinstance(again, tuple)
        assert dlq_event_bytes(again[1][b"event"].decode()) == payload


def test_the_embedded_broker_keeps_and_republishes_the_whole_payload(
    embedded_worker: EmbeddedWorkers, broker_file: Path
) -> None:
    worker = embedded_worker()
    env = admin_env(worker)

    def entry_of(message_id: str) -> tuple[str, str] | None:
        rows = broker_rows(
            broker_file, "SELECT created_ms, seq, event FROM dlq WHERE original_id = ?", message_id
        )
        return (jobs.message_id(rows[0][0], rows[0][1]), rows[0][2]) if rows else None

    for payload in (NESTED, NOT_UTF8):
        conn = sqlite3.connect(broker_file, timeout=30)
        try:
            with conn:
                now_ms = int(time.time() * 1000)
                message_id = jobs.publish(conn, now_ms, EMBEDDED_STREAM, payload, NORMAL)
        finally:
            conn.close()
        found = wait_until(partial(entry_of, message_id), 30, "the DLQ entry")
        assert isinstance(found, tuple)
        entry_id, text = found
        assert text.startswith(EVENT_BASE64_MARK) == (payload == NOT_UTF8)
        assert dlq_event_bytes(text) == payload

        new_id = _republish(env, entry_id)
        seq = jobs.seq_of(new_id)
        [(stored,)] = broker_rows(broker_file, "SELECT payload FROM jobs WHERE seq = ?", seq)
        assert bytes(stored) == payload
        assert entry_of(message_id) is None
        again = wait_until(partial(entry_of, new_id), 30, "the copy's DLQ entry")
        assert isinstance(again, tuple)
        assert dlq_event_bytes(again[1]) == payload
