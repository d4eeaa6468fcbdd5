"""``relay function match --from-stream`` through the CLI: the option checks (one line,
exit 2, before anything is read) and the dry run over a real embedded broker file whose
leases must be exactly as they were afterwards."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock
from relay.entrypoints.cli import app
from tests.json_schemas import assert_matches_schema

TEMPLATE = """\
runtime: python3.14
events:
  - handler: events.created.handler
    pattern: {event_name: [INSERT], table_name: [users]}
"""


@pytest.fixture
def functions(tmp_path: Path) -> Path:
    root = tmp_path / "functions"
    (root / "users").mkdir(parents=True)
    (root / "users" / "template.yaml").write_text(TEMPLATE)
    return root


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, ["function", "match", *args], env=env or {})


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--from-stream", "--since", "soon"],
         "--since: 'soon' is not a positive duration (examples: 30m, 1h, 7d)"),
        (["--from-stream", "--since", "-1h"],
         "--since: '-1h' is not a positive duration (examples: 30m, 1h, 7d)"),
        (["--from-stream", "--limit", "0"], "--limit: must be a positive number of events (got 0)"),
        (["--from-dlq", "--limit", "-3"], "--limit: must be a positive number of events (got -3)"),
        (["--from-stream", "--from-dlq"],
         "--from-stream and --from-dlq cannot be combined: choose one source"),
        (["--from-stream", "--event", "{}"],
         "--event and --file give one event to match: they cannot be combined with "
         "--from-stream or --from-dlq"),
        (["--since", "1h", "--event", "{}"], "--since needs --from-stream or --from-dlq"),
        (["--limit", "5", "--event", "{}"], "--limit needs --from-stream or --from-dlq"),
        (["--json", "--event", "{}"], "--json needs --from-stream or --from-dlq"),
        (["--from-stream", "--at", "yesterday"],
         '--at: "yesterday" is not an RFC3339 timestamp (e.g. 2026-09-12T10:00:00Z)'),
    ],
)  # fmt: skip
def test_a_misused_option_is_one_line_before_anything_is_read(
    functions: Path, args: list[str], line: str
) -> None:
    # No broker is reachable from here: the check must come first.
    result = invoke(str(functions), *args, env={"REDIS_URI": "redis://127.0.0.1:1"})
    # a usage error raised through the shared path names the command's help
    hint = " (see 'relay function match --help')" if "--at" in args else ""
    assert result.output == f"relay: {line}{hint}\n"
    assert result.exit_code == 2


def test_a_missing_broker_file_is_one_line(functions: Path, tmp_path: Path) -> None:
    path = tmp_path / "nothing.sqlite3"
    result = invoke(
        str(functions),
        "--from-stream",
        env={"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(path)},
    )
    assert result.exit_code == 1
    assert result.output.startswith(f"relay: broker file {path} does not exist")
    assert result.output.count("\n") == 1
    assert not path.exists()


def _leases(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            "SELECT seq, state, token, consumer, leased_ms, deliveries FROM jobs ORDER BY seq"
        ).fetchall()
    finally:
        conn.close()


def _fill(path: Path, stream: str) -> None:
    insert = json.dumps({"event_name": "INSERT", "table_name": "users"}).encode()
    other = json.dumps({"event_name": "REMOVE", "table_name": "users"}).encode()

    async def run() -> None:
        store = await anyio.to_thread.run_sync(BrokerStore, path, SystemClock())
        try:
            publisher = SqliteEventPublisher(store, stream)
            await publisher.publish([(insert, None)] * 30 + [(other, None)] * 20)
            await publisher.publish([(b"{broken", None)])
            await store.write(lambda c, now: jobs.claim(c, now, stream, "worker-1", 10))
        finally:
            await anyio.to_thread.run_sync(store.close)

    anyio.run(run)


def test_the_embedded_broker_is_read_without_claiming(functions: Path, tmp_path: Path) -> None:
    path = tmp_path / "broker.sqlite3"
    _fill(path, "events")
    before = _leases(path)
    assert sum(1 for row in before if row[1] == "leased") == 10

    result = invoke(
        str(functions),
        "--from-stream",
        "--json",
        env={"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(path)},
    )

    assert result.exit_code == 0, result.output
    document = assert_matches_schema(result.output)
    assert (document["broker"], document["stream"], document["entries"]) == ("sqlite", "events", 51)
    assert (document["matched"], document["unmatched"], document["malformed"]) == (30, 20, 1)
    assert _leases(path) == before


def test_a_broker_file_of_other_streams_names_them(functions: Path, tmp_path: Path) -> None:
    path = tmp_path / "broker.sqlite3"
    _fill(path, "orders")
    result = invoke(
        str(functions),
        "--from-stream",
        env={"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(path)},
    )
    assert result.exit_code == 1
    assert result.output == (
        f"relay: stream 'events' has no entries in broker file {path} (it holds 'orders';"
        " REDIS_STREAM names it)\n"
    )


def _dead_letter(conn: sqlite3.Connection, created_ms: int, original: str, fn: str) -> None:
    event = json.dumps({"event_name": "INSERT", "table_name": "users"})
    conn.execute(
        "INSERT INTO dlq (created_ms, original_stream, original_id, grp, consumer, event,"
        " reason, function, handler, deliveries, handler_attempts, timestamp)"
        " VALUES (?, 'events', ?, 'relay', 'worker-1', ?, 'exit 1', ?, 'h.h', 5, 5, '')",
        (created_ms, original, event, fn),
    )


def _publish_old(path: Path, stream: str, created_ms: int) -> None:
    insert = b'{"event_name": "INSERT", "table_name": "users"}'

    async def run() -> None:
        store = await anyio.to_thread.run_sync(BrokerStore, path, SystemClock())
        try:
            await store.write(lambda c, _: jobs.publish(c, created_ms, stream, insert, 2))
        finally:
            await anyio.to_thread.run_sync(store.close)

    anyio.run(run)


def test_since_on_the_embedded_broker_and_its_dead_letters(functions: Path, tmp_path: Path) -> None:
    path = tmp_path / "broker.sqlite3"
    old_ms = int(SystemClock().now() * 1000) - 2 * 3600 * 1000
    _publish_old(path, "events", old_ms)  # two hours old
    _fill(path, "events")  # 50 events and one malformed, created just now
    conn = sqlite3.connect(path)
    with conn:
        _dead_letter(conn, old_ms, f"{old_ms}-1", "users")  # dead-lettered two hours ago
        _dead_letter(conn, old_ms + 7_000_000, "1-1", "users")
        _dead_letter(conn, old_ms + 7_000_001, "1-1", "other")  # the same message again
    conn.close()
    env = {"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(path)}

    hour = invoke(str(functions), "--from-stream", "--since", "1h", "--json", env=env)
    dead = invoke(str(functions), "--from-dlq", "--since", "1h", "--json", env=env)
    every = invoke(str(functions), "--from-dlq", "--json", env=env)

    assert hour.exit_code == 0, hour.output
    recent = assert_matches_schema(hour.output)
    assert (recent["entries"], recent["matched"]) == (51, 30)
    assert recent["oldest_id"].endswith("-2")  # the first job after the old one
    assert dead.exit_code == 0, dead.output
    dlq = assert_matches_schema(dead.output)
    assert (dlq["source"], dlq["entries"], dlq["matched"]) == ("dlq", 1, 1)
    assert assert_matches_schema(every.output)["entries"] == 2
