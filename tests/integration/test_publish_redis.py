"""``relay publish`` on the Redis broker: the entries producers would XADD."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

pytestmark = pytest.mark.redis

RELAY = str(Path(sys.executable).with_name("relay"))


def publish(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([RELAY, "publish", *args], env={**os.environ, **env}, input=stdin,
                          capture_output=True, text=True, timeout=60, check=False)


def test_publish_appends_event_entries_and_ignores_priority_with_a_note(
    redis_url: str, unique: str
) -> None:
    """Row 89: on Redis ``relay publish`` XADDs one entry per event with the single
    field ``event`` (what a worker reads); ``--priority`` is ignored, said once."""
    stream = f"{unique}-events"
    env = {"REDIS_URI": redis_url, "REDIS_STREAM": stream, "RELAY_BROKER": "redis"}
    done = publish(env, "--event", '{"a": 1}', "--count", "2", "--priority", "high")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "relay: note: the Redis broker has no priority; --priority is ignored",
        # row 231: no worker has created its group on this new stream yet
        f"relay: note: no consumer group reads stream '{stream}' yet;"
        " the events wait there until a worker creates one",
    ]
    piped = publish(env, stdin='{"b": 2}\n')
    assert piped.returncode == 0, piped.stderr
    ids = done.stdout.split() + piped.stdout.split()
    client = redis.Redis.from_url(redis_url)
    try:
        entries: Any = client.xrange(stream)
    finally:
        client.close()
    assert [i.decode() for i, _ in entries] == ids
    assert [fields for _, fields in entries] == [
        {b"event": b'{"a": 1}'}, {b"event": b'{"a": 1}'}, {b"event": b'{"b": 2}'},
    ]


def test_publish_without_redis_settings_is_one_line() -> None:
    """Row 89: the Redis broker (the default) still requires its variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_BROKER"))}
    done = subprocess.run([RELAY, "publish", "--event", "{}"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("relay: REDIS_URI is required")
