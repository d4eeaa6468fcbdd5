"""``relay publish --delay / --at / --id`` (issue 33), a real ``relay`` subprocess
against a real broker file and a real Redis: what is written, what is printed,
and one usage line for every option out of bounds."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from relay.adapters.redis.keys import delayed_key
from relay.domain.publication import delayed_due

RELAY = str(Path(sys.executable).with_name("relay"))
EVENT = '{"kind": "reminder"}'


def _publish(env: dict[str, str], *args: str, stdin: bytes | None = None) -> Any:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("REDIS_", "RELAY_", "PUBLISH_"))}  # fmt: skip
    return subprocess.run([RELAY, "publish", *args], env={**base, **env}, input=stdin,
                          capture_output=True, timeout=120, check=False)  # fmt: skip


def _err(done: Any) -> list[str]:
    return [str(line) for line in done.stderr.decode().splitlines()]


@pytest.fixture
def embedded(tmp_path: Path) -> dict[str, str]:
    return {"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(tmp_path / "broker.db"),
            "REDIS_STREAM": "events"}  # fmt: skip


def _jobs(env: dict[str, str]) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(env["RELAY_BROKER_PATH"])
    try:
        return conn.execute("SELECT created_ms, seq, ready_ms FROM jobs ORDER BY seq").fetchall()
    finally:
        conn.close()


def test_delay_sets_the_ready_time_and_prints_the_job_id(embedded: dict[str, str]) -> None:
    before = time.time_ns() // 1_000_000
    done = _publish(embedded, "--event", EVENT, "--delay", "10m", "--count", "2")
    after = time.time_ns() // 1_000_000
    assert done.returncode == 0, _err(done)
    jobs = _jobs(embedded)
    assert done.stdout.decode().split() == [f"{c}-{s}" for c, s, _ in jobs]
    assert all(before + 600_000 <= ready <= after + 600_000 for _, _, ready in jobs)


def test_at_takes_an_rfc3339_time_with_its_zone_and_the_past_is_now(
    embedded: dict[str, str]
) -> None:
    at_ms = (time.time_ns() // 1_000_000 // 1000 + 86_400) * 1000  # tomorrow, whole seconds
    text = datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")
    assert _publish(embedded, "--event", EVENT, "--at", text).returncode == 0
    assert _publish(embedded, "--event", EVENT, "--at", "2001-01-01T00:00:00Z").returncode == 0
    assert [ready for _, _, ready in _jobs(embedded)] == [at_ms, None]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--delay", "400d"], "relay: --delay: the time is more than 365 days ahead"),
        (["--delay", "soon"], "relay: --delay: 'soon' is not a duration"),
        (["--delay", "-5m"], "relay: --delay: '-5m' is negative"),
        (["--at", "2030-01-01T00:00:00"], "relay: --at: '2030-01-01T00:00:00' has no zone"),
        (["--at", "tomorrow"], "relay: --at: 'tomorrow' is not an RFC 3339 time"),
        (["--delay", "1m", "--at", "2030-01-01T00:00:00Z"], "relay: --delay and --at exclude"),
        (["--id", "has space"], "relay: --id: idempotency key 'has space' has other characters"),
        (["--id", "x" * 200], "relay: --id: idempotency key is 200 characters: expected 1 to 128"),
        (["--id", "k", "--count", "2"], "relay: --id names one event"),
    ],
)
def test_options_out_of_bounds_are_one_usage_line_and_write_nothing(
    embedded: dict[str, str], args: list[str], expected: str
) -> None:
    done = _publish(embedded, "--event", EVENT, *args)
    assert done.returncode == 2
    [line] = _err(done)
    assert line.startswith(expected)
    assert not Path(embedded["RELAY_BROKER_PATH"]).exists()


def test_an_id_with_stdin_is_refused(embedded: dict[str, str]) -> None:
    done = _publish(embedded, "--id", "k", stdin=b'{"n": 1}\n')
    assert done.returncode == 2
    assert _err(done) == ["relay: --id names one event: use it with --event, without --count"
                          " or stdin (see 'relay publish --help')"]


def test_the_same_id_twice_publishes_once_and_prints_the_first_id(
    embedded: dict[str, str]
) -> None:
    first = _publish(embedded, "--event", EVENT, "--id", "order-17")
    again = _publish(embedded, "--event", '{"kind": "other"}', "--id", "order-17")
    assert first.returncode == again.returncode == 0
    assert first.stdout == again.stdout
    assert len(_jobs(embedded)) == 1


def test_a_bad_dedup_window_is_one_line(embedded: dict[str, str]) -> None:
    done = _publish({**embedded, "PUBLISH_DEDUP_WINDOW": "a day"}, "--event", EVENT, "--id", "k")
    assert done.returncode == 1
    assert _err(done) == ["relay: PUBLISH_DEDUP_WINDOW='a day' is invalid:"
                          " a positive duration such as 24h or 7d"]


@pytest.mark.redis
def test_on_redis_a_delayed_publish_prints_its_delayed_id_and_an_id_publishes_once(
    redis_url: str, unique: str
) -> None:
    stream = f"{unique}-events"
    env = {"REDIS_URI": redis_url, "REDIS_STREAM": stream}
    before = time.time_ns() // 1_000_000
    done = _publish(env, "--event", EVENT, "--delay", "1h")
    assert done.returncode == 0, _err(done)
    [delayed] = done.stdout.decode().split()
    due = delayed_due(delayed)
    assert due is not None
    assert before + 3_600_000 <= due <= time.time_ns() // 1_000_000 + 3_600_000
    first = _publish(env, "--event", EVENT, "--id", "order-17")
    again = _publish(env, "--event", EVENT, "--id", "order-17")
    assert first.returncode == again.returncode == 0
    assert first.stdout == again.stdout
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.zcard(delayed_key(stream)) == 1
        assert client.xlen(stream) == 1
    finally:
        client.close()
