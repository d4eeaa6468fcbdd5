"""``relay dlq ls`` refuses a wrong ``REDIS_STREAM`` exactly as ``relay trace`` does.

Issue 35 item 13 reported ``dlq ls`` answering "No dead-lettered entries" for a
typo'd stream while ``trace`` refused it; commit 37d5974 made ``dlq ls`` check
the stream. This confirms it on both brokers, against ``trace``'s own line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

RELAY = str(Path(sys.executable).with_name("relay"))


def _relay(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_"))}
    return subprocess.run([RELAY, *args], env={**base, **env}, input=stdin, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def _refused_alike(env: dict[str, str], stream: str) -> None:
    listed = _relay(env, "dlq", "ls")
    traced = _relay(env, "trace", "1-0")
    for done in (listed, traced):
        assert done.returncode == 1, done.stdout
        assert done.stdout == ""
    [dlq_line] = listed.stderr.splitlines()
    [trace_line] = traced.stderr.splitlines()
    assert dlq_line == trace_line
    assert f"stream {stream!r}" in dlq_line
    assert "REDIS_STREAM names it" in dlq_line


def test_dlq_ls_refuses_a_wrong_stream_like_trace_on_the_embedded_broker(tmp_path: Path) -> None:
    """Row 230 (embedded): the file holds stream 'events'; 'evnets' is a typo."""
    env = {"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(tmp_path / "broker.db"),
           "RELAY_STATE_DIR": str(tmp_path / "state"), "RELAY_RUN_DIR": str(tmp_path / "run")}
    published = _relay({**env, "REDIS_STREAM": "events"}, "publish", stdin='{"a": 1}\n')
    assert published.returncode == 0, published.stderr
    _refused_alike({**env, "REDIS_STREAM": "evnets"}, "evnets")
    right = _relay({**env, "REDIS_STREAM": "events"}, "dlq", "ls")
    assert (right.returncode, right.stdout.strip()) == (0, "No dead-lettered entries")


@pytest.mark.redis
def test_dlq_ls_refuses_a_wrong_stream_like_trace_on_redis(
    tmp_path: Path, redis_url: str, unique: str
) -> None:
    """Row 230 (Redis): no such stream on the server."""
    stream = f"{unique}-typo"
    env = {"REDIS_URI": redis_url, "REDIS_STREAM": stream, "REDIS_GROUP": "relay",
           "RELAY_STATE_DIR": str(tmp_path / "state"), "RELAY_RUN_DIR": str(tmp_path / "run")}
    _refused_alike(env, stream)
    client = redis.Redis.from_url(redis_url)
    try:
        client.xgroup_create(stream, "relay", id="0", mkstream=True)
        right = _relay(env, "dlq", "ls")
    finally:
        client.delete(stream)
        client.close()
    assert (right.returncode, right.stdout.strip()) == (0, "No dead-lettered entries")
