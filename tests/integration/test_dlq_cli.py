"""``relay dlq ls|inspect|rm|replay`` as an operator runs them, against real Redis.

Entries are seeded with XADD in the spec's flat format. ``replay`` is driven
against a stand-in control socket that answers like a worker would, so the
test proves the CLI's side: what it sends, and that the entry goes only after
a successful answer.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

pytestmark = pytest.mark.redis

RELAY = str(Path(sys.executable).parent / "relay")


def entry_fields(**overrides: str) -> dict[str, str]:
    fields = {
        "original_stream": "events",
        "original_id": "1700000000000-0",
        "group": "relay",
        "consumer": "worker-1",
        "event": json.dumps({"event_name": "INSERT", "id": 7}),
        "reason": "handler failed: exit status 1",
        "function": "user-events",
        "handler": "events.created.handler",
        "deliveries": "6",
        "handler_attempts": "5",
        "timestamp": "2026-01-02T03:04:05Z",
    }
    fields.update(overrides)
    return fields


MALFORMED = entry_fields(
    event="{not json",
    reason="malformed event: not a JSON object",
    function="-",
    handler="-",
    deliveries="1",
    handler_attempts="0",
)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url, decode_responses=True)
    yield conn
    conn.close()


@pytest.fixture
def stream(client: redis.Redis) -> Iterator[str]:
    name = f"test-dlq-{uuid.uuid4().hex[:12]}"
    yield name
    client.delete(f"relay:{name}:dlq")


@pytest.fixture
def run_dir() -> Iterator[Path]:
    # A short path: Unix socket paths are limited to about 100 bytes.
    path = Path("/tmp") / f"relay-dlq-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def seed(client: redis.Redis, stream: str, fields: dict[str, str]) -> str:
    return str(client.xadd(f"relay:{stream}:dlq", fields))  # type: ignore[arg-type]


def dlq_ids(client: redis.Redis, stream: str) -> list[str]:
    entries: Any = client.xrange(f"relay:{stream}:dlq")
    return [entry_id for entry_id, _ in entries]


def relay(
    redis_url: str, stream: str, *args: str, run_dir: Path | None = None, group: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_"))}
    env |= {"REDIS_URI": redis_url, "REDIS_STREAM": stream}
    if group:
        env["REDIS_GROUP"] = "relay"
    if run_dir is not None:
        env["RELAY_RUN_DIR"] = str(run_dir)
    return subprocess.run(
        [RELAY, "dlq", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_ls_on_an_empty_dlq(redis_url: str, client: redis.Redis, stream: str) -> None:
    client.xgroup_create(stream, "relay", id="0", mkstream=True)
    try:
        result = relay(redis_url, stream, "ls")
    finally:
        client.delete(stream)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "No dead-lettered entries"


def test_ls_of_a_stream_that_does_not_exist_is_an_error_not_an_empty_answer(
    redis_url: str, client: redis.Redis, stream: str
) -> None:
    result = relay(redis_url, stream, "ls")
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("relay: ")
    assert stream in line
    assert "REDIS_STREAM" in line
    # a DLQ that holds entries is still listed after its stream is gone
    seed(client, stream, entry_fields())
    listed = relay(redis_url, stream, "ls")
    assert listed.returncode == 0, listed.stderr
    assert "user-events" in listed.stdout


def test_ls_lists_newest_first_with_the_documented_columns(
    redis_url: str, client: redis.Redis, stream: str
) -> None:
    older = seed(client, stream, entry_fields())
    newer = seed(client, stream, MALFORMED)
    result = relay(redis_url, stream, "ls")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ID", "ORIGINAL", "FUNCTION", "HANDLER", "ATTEMPTS", "AGE"]
    assert lines[1].split()[:5] == [newer, "1700000000000-0", "-", "-", "0"]
    assert lines[2].split()[:5] == [
        older,
        "1700000000000-0",
        "user-events",
        "events.created.handler",
        "5",
    ]
    assert lines[2].endswith("ago") or lines[2].split()[-1].startswith("20")


def test_ls_pages_through_every_entry_in_either_order(
    redis_url: str, client: redis.Redis, stream: str
) -> None:
    seeded = [seed(client, stream, entry_fields(original_id=f"{n}-0")) for n in range(105)]
    newest = relay(redis_url, stream, "ls", "--limit", "0")
    oldest = relay(redis_url, stream, "ls", "--limit", "0", "--oldest-first")
    capped = relay(redis_url, stream, "ls")
    assert [line.split()[0] for line in newest.stdout.splitlines()[1:]] == seeded[::-1]
    assert [line.split()[0] for line in oldest.stdout.splitlines()[1:]] == seeded
    assert capped.stdout.splitlines()[-1] == "(100 of 105 entries shown; use --limit 0 for all)"


def test_inspect_shows_metadata_and_the_pretty_printed_event(
    redis_url: str, client: redis.Redis, stream: str
) -> None:
    entry_id = seed(client, stream, entry_fields())
    result = relay(redis_url, stream, "inspect", entry_id)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for expected in (
        f"ID:                {entry_id}",
        "Original stream:   events",
        "Function:          user-events",
        "Handler:           events.created.handler",
        "Handler attempts:  5",
        "Deliveries:        6",
        "Reason:            handler failed: exit status 1",
        "Dead-lettered:     2026-01-02T03:04:05Z",
    ):
        assert expected in text
    event_text = text.split("Event:\n", 1)[1]
    assert json.loads(event_text) == {"event_name": "INSERT", "id": 7}
    assert '  "event_name": "INSERT"' in event_text


def test_inspect_prints_a_malformed_payload_verbatim(
    redis_url: str, client: redis.Redis, stream: str
) -> None:
    entry_id = seed(client, stream, MALFORMED)
    result = relay(redis_url, stream, "inspect", entry_id)
    assert result.returncode == 0, result.stderr
    assert "Event (not a JSON object; shown verbatim):\n{not json\n" in result.stdout


def test_inspect_of_an_unknown_or_invalid_id_is_one_clear_line(redis_url: str, stream: str) -> None:
    for bad in ("1-0", "nonsense"):
        result = relay(redis_url, stream, "inspect", bad)
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1
        assert "Traceback" not in result.stderr


def test_rm_deletes_exactly_one_entry(redis_url: str, client: redis.Redis, stream: str) -> None:
    first = seed(client, stream, entry_fields())
    second = seed(client, stream, entry_fields(original_id="1700000000001-0"))
    result = relay(redis_url, stream, "rm", first)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"Removed {first}"
    assert dlq_ids(client, stream) == [second]


def test_rm_refuses_an_id_that_does_not_exist(
    redis_url: str, client: redis.Redis, stream: str
) -> None:
    kept = seed(client, stream, entry_fields())
    result = relay(redis_url, stream, "rm", "1-1")
    assert result.returncode == 1
    assert result.stderr.strip() == f"relay: no dead-letter entry 1-1 in relay:{stream}:dlq"
    assert dlq_ids(client, stream) == [kept]


def test_missing_settings_are_one_line_and_exit_1(redis_url: str) -> None:
    result = relay(redis_url, "", "ls")
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == "relay: REDIS_STREAM is required: the name of the stream to consume"
    )


def test_replay_needs_redis_group(redis_url: str, client: redis.Redis, stream: str) -> None:
    entry_id = seed(client, stream, entry_fields())
    result = relay(redis_url, stream, "replay", entry_id, group=False)
    assert result.returncode == 1
    assert "REDIS_GROUP" in result.stderr


def test_a_malformed_entry_is_republished_and_a_summary_is_refused(
    redis_url: str, client: redis.Redis, stream: str, run_dir: Path
) -> None:
    """A placeholder entry names no handler: its replay appends the payload it keeps
    to the stream again (no worker needed); an oversized event's entry keeps only a
    summary, so its replay is refused and the entry kept."""
    entry_id = seed(client, stream, {**MALFORMED, "original_stream": stream})
    result = relay(redis_url, stream, "replay", entry_id, run_dir=run_dir)
    assert result.returncode == 0, result.stderr
    new_id = result.stdout.split()[3]
    assert result.stdout.startswith(f"Republished {entry_id} as {new_id} on stream {stream} ")
    republished: Any = client.xrange(stream, new_id, new_id)
    assert [fields for _, fields in republished] == [{"event": "{not json"}]
    assert dlq_ids(client, stream) == []

    oversized = seed(
        client,
        stream,
        {**MALFORMED, "reason": "event is 9000 bytes, larger than MAX_EVENT_BYTES (1024)"},
    )
    result = relay(redis_url, stream, "replay", oversized, run_dir=run_dir)
    assert result.returncode == 1
    assert "whose payload it does not hold" in result.stderr
    assert dlq_ids(client, stream) == [oversized]


def test_replay_without_a_worker_keeps_the_entry(
    redis_url: str, client: redis.Redis, stream: str, run_dir: Path
) -> None:
    entry_id = seed(client, stream, entry_fields())
    result = relay(redis_url, stream, "replay", entry_id, run_dir=run_dir)
    assert result.returncode == 1
    assert "running worker" in result.stderr
    assert "the entry is kept" in result.stderr
    assert dlq_ids(client, stream) == [entry_id]


class StandInWorker:
    """Answers one control request the way a worker does; records what it got."""

    def __init__(self, path: Path, reply: dict[str, Any]) -> None:
        self.requests: list[dict[str, Any]] = []
        self._reply = reply
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._server.accept()
        with conn:
            data = b""
            while not data.endswith(b"\n"):
                data += conn.recv(65536)
            self.requests.append(json.loads(data))
            conn.sendall(json.dumps(self._reply).encode() + b"\n")

    def close(self) -> None:
        self._thread.join(timeout=10)
        self._server.close()


@pytest.mark.parametrize(
    ("reply", "code", "kept"),
    [
        ({"ok": True, "result": {"replayed": True}}, 0, False),
        ({"ok": False, "error": "handler failed: exit status 1", "kind": "HandlerFailed"}, 1, True),
    ],
)
def test_replay_goes_through_the_worker_and_deletes_only_on_success(
    redis_url: str,
    client: redis.Redis,
    stream: str,
    run_dir: Path,
    reply: dict[str, Any],
    code: int,
    kept: bool,
) -> None:
    entry_id = seed(client, stream, entry_fields())
    other = seed(client, stream, entry_fields(original_id="1700000000001-0"))
    worker = StandInWorker(run_dir / "relay.sock", reply)
    try:
        result = relay(redis_url, stream, "replay", entry_id, run_dir=run_dir)
    finally:
        worker.close()
    assert worker.requests == [
        {"v": 1, "command": {"cmd": "replay_dead_letter", "entry_id": entry_id}}
    ]
    assert result.returncode == code, result.stderr
    remaining = dlq_ids(client, stream)
    assert remaining == ([entry_id, other] if kept else [other])
    if kept:
        assert "handler failed: exit status 1" in result.stderr
    else:
        assert result.stdout.strip() == (
            f"Replayed {entry_id} (user-events/events.created.handler); entry removed"
        )
