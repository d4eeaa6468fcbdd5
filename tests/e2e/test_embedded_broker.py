"""The embedded broker as a user meets it: the quick start with no Redis anywhere,
``relay publish`` refusing bad input, and ``relay start`` refusing a corrupt file."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from tests.e2e.harness import FIRST_START_TIMEOUT_S, REPO, run_relay, wait_until

pytestmark = pytest.mark.e2e

EXAMPLE_LINES = (
    'handler "events.created.handler" message "{id}": User created: user_123',
    'handler "handler.handler" message "{id}": Sending welcome email to john@example.com',
)


def no_redis_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_")}
    return {**env, **extra}


@pytest.fixture
def hostname(unique: str) -> Iterator[str]:
    name = f"qs-{unique}"
    yield name
    client = docker.from_env()
    try:
        for c in client.containers.list(all=True, sparse=True,
                                        filters={"label": f"relay.hostname={name}"}):
            with contextlib.suppress(docker.errors.APIError):  # already going away
                c.remove(force=True)
    finally:
        client.close()


@pytest.mark.docker
def test_the_quick_start_runs_the_example_event_with_no_redis(
    tmp_path: Path, hostname: str
) -> None:
    """Row 85: ``scripts/quickstart`` then ``scripts/quickstart send``, with no
    ``REDIS_*`` variable set and no Redis started: the example event reaches both
    example handlers through the broker file, and Ctrl-C stops it cleanly."""
    env = no_redis_env(RELAY_QUICKSTART_DIR=str(tmp_path / "qs"), RELAY_HOSTNAME=hostname)
    proc = subprocess.Popen([str(REPO / "scripts" / "quickstart")], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    assert proc.stdout is not None
    pump = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    pump.start()
    try:
        wait_until(lambda: any("msg=relay_started" in line for line in lines),
                   FIRST_START_TIMEOUT_S, "relay_started")
        sent = subprocess.run([str(REPO / "scripts" / "quickstart"), "send"], env=env,
                              capture_output=True, text=True, timeout=60, check=True)
        message_id = sent.stdout.split()[-1]
        for expected in EXAMPLE_LINES:
            wanted = expected.format(id=message_id)

            def seen(w: str = wanted) -> bool:
                return any(w in line for line in lines)

            wait_until(seen, 60, wanted)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=60)
        pump.join(timeout=10)
        proc.stdout.close()
    assert code == 0
    assert (tmp_path / "qs" / "broker.sqlite3").exists()
    assert not any("REDIS_URI" in line for line in lines)
    standins = [line for line in lines if line.startswith("quickstart: no image registry")]
    assert len(standins) <= 1  # said once when stand-ins are used, never silently


def test_a_corrupt_broker_file_fails_start_with_one_line_and_is_kept(tmp_path: Path) -> None:
    """Row 83: ``relay start --embedded`` on a file that is not a database exits 1
    with one line naming the file; the file is not recreated or changed."""
    broken = tmp_path / "broker.sqlite3"
    broken.write_bytes(b"this is not a database\n" * 100)
    before = broken.read_bytes()
    done = run_relay(
        ["start", "--embedded", "--functions", str(tmp_path)],
        no_redis_env(RELAY_BROKER_PATH=str(broken), RELAY_STATE_DIR=str(tmp_path / "state"),
                     RELAY_RUN_DIR=str(tmp_path / "run")),
    )
    assert done.returncode == 1
    # the log says startup_failed; the user's line is the one starting "relay: "
    [line] = [x for x in done.stderr.splitlines() if x.startswith("relay: ")]
    assert line.startswith(f"relay: broker file {broken} is corrupt (")
    assert "Traceback" not in done.stdout + done.stderr
    assert broken.read_bytes() == before


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["--event", "{nope"], None, "relay: --event: event is not valid JSON: "),
        (["--event", "[1, 2]"], None, "relay: --event: event must be a JSON object, not an array"),
        (["--event", '{"a": 1}', "--priority", "urgent"], None,
         "relay: --priority: priority 'urgent' is not one of critical, high, normal, low"),
        (["--event", '{"pad": "' + "x" * 300 + '"}'], None,
         "relay: --event: event is 311 bytes, over MAX_EVENT_BYTES (256)"),
        ([], '{"a": 1}\n{"b": 2}\n"text"\n', "relay: stdin line 3: event must be a JSON object"),
        (["--event", "{}", "--count", "0"], None, "relay: --count 0 is invalid: expected a "),
    ],
)
def test_relay_publish_refuses_bad_input_in_one_line_and_publishes_nothing(
    tmp_path: Path, args: list[str], stdin: str | None, message: str
) -> None:
    """Row 84: each bad input is one line naming what is wrong; nothing is appended."""
    path = tmp_path / "broker.sqlite3"
    env = no_redis_env(RELAY_BROKER="sqlite", RELAY_BROKER_PATH=str(path), MAX_EVENT_BYTES="256")
    done = run_relay(["publish", *args], env, stdin=stdin if stdin is not None else "")
    # a wrong command line exits 2 (row 276), a bad event 1
    assert done.returncode == (2 if {"--count", "--priority"} & set(args) else 1)
    [line] = done.stderr.splitlines()
    assert line.startswith(message)
    assert done.stdout == ""
    if path.exists():
        conn = sqlite3.connect(path)
        try:
            assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
        finally:
            conn.close()


def test_relay_publish_appends_with_priority_and_count(tmp_path: Path) -> None:
    """``relay publish`` prints one id per event; the class is stored beside it."""
    path = tmp_path / "broker.sqlite3"
    env = no_redis_env(RELAY_BROKER="sqlite", RELAY_BROKER_PATH=str(path))
    done = run_relay(["publish", "--event", '{"a": 1}', "--priority", "high", "--count", "3"],
                     env)
    assert done.returncode == 0, done.stderr
    piped = run_relay(["publish"], env, stdin='{"b": 1}\n\n{"b": 2}\n')
    assert piped.returncode == 0, piped.stderr
    ids = done.stdout.split() + piped.stdout.split()
    assert len(ids) == len(set(ids)) == 5
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT priority, payload FROM jobs ORDER BY seq").fetchall()
    finally:
        conn.close()
    assert rows == [(1, b'{"a": 1}')] * 3 + [(2, b'{"b": 1}'), (2, b'{"b": 2}')]


@pytest.mark.docker
def test_relay_health_checks_the_broker_file(tmp_path: Path) -> None:
    """Row 88: ``relay health`` on the embedded broker: a missing or corrupt file is
    one line and exit 1; a sound one (and Docker answering) is ``ok``."""
    path = tmp_path / "broker.sqlite3"
    env = no_redis_env(RELAY_BROKER="sqlite", RELAY_BROKER_PATH=str(path),
                       RELAY_RUN_DIR=str(tmp_path / "run"))
    missing = run_relay(["health"], env)
    assert (missing.returncode, missing.stderr.strip()) == (
        1, f"relay: broker file {path} does not exist (is a worker running here?)"
    )
    path.write_bytes(b"no database here\n" * 10)
    corrupt = run_relay(["health"], env)
    assert corrupt.returncode == 1
    assert corrupt.stderr.strip().startswith(f"relay: broker file {path} is corrupt (")
    path.unlink()
    assert run_relay(["publish", "--event", "{}"], env).returncode == 0  # creates the file
    healthy = run_relay(["health"], env)
    assert (healthy.returncode, healthy.stdout.strip()) == (0, "ok"), healthy.stderr
