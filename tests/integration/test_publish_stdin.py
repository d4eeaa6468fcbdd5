"""``relay publish`` of many events from stdin, in one process, on both brokers.

A real ``relay`` subprocess against a real broker file and a real Redis: every
good line is one entry, every bad line is one line on stderr with its number,
the batch holding the first bad line and everything after it is not published,
and the last line says what was (docs/producing.md). On Redis, a stream that no
consumer group reads yet is published to, with one note.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

RELAY = str(Path(sys.executable).with_name("relay"))


def _publish(env: dict[str, str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_"))}
    return subprocess.run([RELAY, "publish"], env={**base, **env}, input=stdin,
                          capture_output=True, timeout=120, check=False)  # fmt: skip


def _events(count: int, start: int = 0) -> bytes:
    return b"".join(b'{"n": %d}\n' % n for n in range(start, start + count))


def _err(done: subprocess.CompletedProcess[bytes]) -> list[str]:
    return done.stderr.decode().splitlines()


@pytest.fixture
def embedded(tmp_path: Path) -> dict[str, str]:
    return {"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(tmp_path / "broker.db"),
            "REDIS_STREAM": "events"}  # fmt: skip


def _jobs(env: dict[str, str]) -> list[int]:
    conn = sqlite3.connect(env["RELAY_BROKER_PATH"])
    try:
        rows = conn.execute("SELECT payload FROM jobs ORDER BY seq").fetchall()
    finally:
        conn.close()
    return [int(bytes(r[0]).split(b":")[1].strip(b" }")) for r in rows]


# --- embedded broker -----------------------------------------------------------------


def test_a_thousand_events_from_stdin_in_one_process_embedded(embedded: dict[str, str]) -> None:
    """Row 234: one process, one entry and one printed id per line."""
    done = _publish(embedded, _events(1000))
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 1000
    assert _jobs(embedded) == list(range(1000))


def test_bad_lines_are_each_reported_and_nothing_after_the_first_bad_batch_is_published(
    embedded: dict[str, str],
) -> None:
    """Row 234: lines 1-500 (a whole batch) go out; the batch holding line 600 and
    everything after it do not; every bad line is named, then a summary."""
    stdin = (_events(599) + b'"text"\n' + _events(10, 599) + b"\n{nope\n"
             + b'{"pad": "\xff"}\n' + _events(5, 609))  # fmt: skip
    done = _publish(embedded, stdin)
    assert done.returncode == 1
    assert _err(done) == [
        "relay: stdin line 600: event must be a JSON object, not a string",
        "relay: stdin line 612: event is not valid JSON: Expecting property name enclosed"
        " in double quotes (line 1, column 2)",
        "relay: stdin line 613: not UTF-8 text (byte 10)",
        "relay: 3 bad lines; published the 500 event(s) of lines 1-500 (ids above),"
        " nothing from line 501 on",
    ]
    assert len(done.stdout.split()) == 500
    assert _jobs(embedded) == list(range(500))


def test_one_bad_line_and_nothing_published_is_one_line(embedded: dict[str, str]) -> None:
    done = _publish(embedded, _events(3) + b"[1]\n")
    assert done.returncode == 1
    assert _err(done) == ["relay: stdin line 4: event must be a JSON object, not an array"]
    assert done.stdout == b""
    assert _jobs(embedded) == []


def test_an_oversized_line_is_skipped_not_held(embedded: dict[str, str]) -> None:
    """Row 234: a 3 MiB line (no newline until its end) is refused with its size;
    the lines around it are checked and nothing is published."""
    huge = b'{"pad": "' + b"x" * (3 * 1024 * 1024) + b'"}\n'
    done = _publish({**embedded, "MAX_EVENT_BYTES": "1KiB"}, _events(2) + huge + _events(1))
    assert done.returncode == 1
    assert _err(done) == [f"relay: stdin line 3: event is {len(huge) - 1} bytes,"
                          " over MAX_EVENT_BYTES (1024)"]  # fmt: skip
    assert _jobs(embedded) == []


# --- Redis ---------------------------------------------------------------------------


@pytest.fixture
def stream(redis_url: str, unique: str) -> Iterator[str]:
    name = f"{unique}-publish"
    yield name
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(name)
    finally:
        client.close()


def _entries(redis_url: str, stream: str) -> list[int]:
    client = redis.Redis.from_url(redis_url)
    try:
        found: Any = client.xrange(stream)
    finally:
        client.close()
    return [int(fields[b"event"].split(b":")[1].strip(b" }")) for _, fields in found]


@pytest.mark.redis
def test_a_thousand_events_and_bad_lines_on_redis(redis_url: str, stream: str) -> None:
    """Row 234 on Redis: the same rule, the same lines."""
    env = {"REDIS_URI": redis_url, "REDIS_STREAM": stream}
    done = _publish(env, _events(1000))
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 1000
    bad = _publish(env, _events(700, 1000) + b"{}\n" + b"5\n")
    assert bad.returncode == 1
    assert _err(bad) == [
        "relay: stdin line 702: event must be a JSON object, not a number",
        f"relay: note: no consumer group reads stream '{stream}' yet;"
        " the events wait there until a worker creates one",
        "relay: 1 bad line; published the 500 event(s) of lines 1-500 (ids above),"
        " nothing from line 501 on",
    ]
    assert _entries(redis_url, stream) == list(range(1500))


@pytest.mark.redis
def test_publish_to_a_stream_no_group_reads_yet_publishes_with_one_note(
    redis_url: str, stream: str
) -> None:
    """Row 231: a producer may start before the worker: the events are appended, and
    one line says no group reads them yet; once the group exists, no note."""
    env = {"REDIS_URI": redis_url, "REDIS_STREAM": stream, "REDIS_GROUP": "relay"}
    first = _publish(env, _events(2))
    assert first.returncode == 0, first.stderr
    assert len(first.stdout.split()) == 2
    assert _err(first) == [
        f"relay: note: no consumer group 'relay' reads stream '{stream}' yet"
        " (REDIS_GROUP names it); the events wait there until a worker creates it"
    ]
    unset = {k: v for k, v in env.items() if k != "REDIS_GROUP"}
    anonymous = _publish(unset, _events(1, 2))
    assert _err(anonymous) == [
        f"relay: note: no consumer group reads stream '{stream}' yet;"
        " the events wait there until a worker creates one"
    ]
    client = redis.Redis.from_url(redis_url)
    try:
        client.xgroup_create(stream, "other", id="0")
        other = _publish(env, _events(1, 3))  # a group, but not REDIS_GROUP
        client.xgroup_create(stream, "relay", id="0")
        read = _publish(env, _events(1, 4))
    finally:
        client.close()
    assert "no consumer group 'relay'" in _err(other)[0]
    assert _publish(unset, _events(1, 5)).stderr == b""
    assert read.returncode == 0
    assert read.stderr == b""
    assert _entries(redis_url, stream) == list(range(6))
