"""``relay publish --traceparent`` on both brokers: the producer's W3C trace context
goes beside the event (never inside it, never taken from the event body), and
the worker's stream reads it back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.asyncio import Redis

from relay.adapters.redis.stream import RedisEventStream
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.adapters.system import SystemClock

RELAY = str(Path(sys.executable).with_name("relay"))
GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OTHER = "00-11111111111111111111111111111111-2222222222222222-01"


def publish(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([RELAY, "publish", *args], env={**os.environ, **env}, input=stdin,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.redis
@pytest.mark.anyio
async def test_on_redis_the_flag_is_a_field_beside_the_event(redis_url: str, unique: str) -> None:
    stream = f"{unique}-events"
    env = {"REDIS_URI": redis_url, "REDIS_STREAM": stream, "RELAY_BROKER": "redis"}
    client = redis.Redis.from_url(redis_url)
    try:
        client.xgroup_create(stream, "relay", id="0", mkstream=True)
        flagged = publish(env, "--event", '{"a": 1}', "--traceparent", GOOD)
        assert flagged.returncode == 0, flagged.stderr
        # a stdin line's own "traceparent" key is part of the event, not the context
        piped = publish(env, stdin=f'{{"traceparent": "{OTHER}"}}\n')
        assert piped.returncode == 0, piped.stderr
        entries: Any = client.xrange(stream)
    finally:
        client.close()
    assert [fields for _, fields in entries] == [
        {b"event": b'{"a": 1}', b"traceparent": GOOD.encode()},
        {b"event": f'{{"traceparent": "{OTHER}"}}'.encode()},
    ]
    reader = Redis.from_url(redis_url)
    try:
        consumer = RedisEventStream(reader, stream=stream, group="relay", consumer="w")
        messages = await consumer.read(10, 100)
    finally:
        await reader.aclose()
    assert [m.traceparent for m in messages] == [GOOD, ""]


@pytest.mark.anyio
async def test_on_the_embedded_broker_the_flag_is_stored_with_each_event(tmp_path: Path) -> None:
    path = tmp_path / "broker.sqlite3"
    env = {"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(path)}
    done = publish(env, "--event", "{}", "--count", "2", "--traceparent", GOOD)
    assert done.returncode == 0, done.stderr
    store = BrokerStore(path, SystemClock())
    try:
        consumer = SqliteEventStream(store, stream="events", group="relay", consumer="w")
        messages = await consumer.read(10, 0)
    finally:
        store.close()
    assert [m.traceparent for m in messages] == [GOOD, GOOD]


def test_a_bad_flag_is_one_usage_line_and_nothing_is_published(tmp_path: Path) -> None:
    path = tmp_path / "broker.sqlite3"
    env = {"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(path)}
    done = publish(env, "--event", "{}", "--traceparent", "00-not-a-trace-01")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("relay: --traceparent is invalid: expected the W3C form")
    assert not path.exists()
