"""``relay backup``: a consistent copy of the live state database and broker file.

A real writer process keeps committing to both files (the broker's own publisher,
one event per transaction, and the state database's own upsert) while the real
``relay backup`` command copies them. Each copy must be a sound database holding an
unbroken prefix of the writer's commits: every event 0..n-1 and nothing torn. A
worker restored from the copies starts.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import RelayWorker, run_relay, wait_until

WRITER = """\
import sys, time
from pathlib import Path

import anyio

from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.db import open_db
from relay.adapters.system import SystemClock

broker, state, stop = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])


async def main() -> None:
    store = BrokerStore(broker, SystemClock())
    publisher = SqliteEventPublisher(store, "events")
    db = open_db(state)
    stop.with_name("ready").touch()
    n = 0
    while not stop.exists():
        await publisher.publish([(b'{"kind": "backup-test", "n": %d}' % n, None)])
        db.upsert("function_stats", f"fn-{n:06d}", {"n": n}, "2026-01-01T00:00:00Z")
        n += 1
    db.close()
    store.close()


anyio.run(main)
"""


def count(path: Path, table: str) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


class Live:
    """The writer's files, and the environment an operator's shell has for them."""

    def __init__(self, root: Path) -> None:
        self.broker = root / "broker.sqlite3"
        self.state_dir = root / "state"
        self.stop = root / "stop"
        self.env = {
            "RELAY_BROKER": "sqlite",
            "RELAY_BROKER_PATH": str(self.broker),
            "RELAY_STATE_DIR": str(self.state_dir),
        }

    @property
    def database(self) -> Path:
        return self.state_dir / "db.sqlite3"

    def started(self) -> bool:
        """Both files exist with their schema (the writer makes them, then commits)."""
        return self.database.exists() and self.stop.with_name("ready").exists()

    def events(self) -> int:
        return count(self.broker, "jobs")


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    files = Live(tmp_path / "live")
    files.state_dir.mkdir(parents=True)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(files.broker), str(files.database), str(files.stop)],
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: files.started() and files.events() >= 200, 60, "200 commits")
        yield files
    finally:
        files.stop.touch()
        writer.wait(timeout=30)
    assert writer.returncode == 0


def take_backup(live: Live, target: Path) -> tuple[int, int]:
    """``relay backup`` while the writer commits; the event counts before and after."""
    before = live.events()
    done = run_relay(["backup", str(target)], live.env)
    after = live.events()
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines() == [
        f"Backed up {live.database} to {target / 'db.sqlite3'} ({size} bytes)"
        for size in [(target / "db.sqlite3").stat().st_size]
    ] + [
        f"Backed up {live.broker} to {target / 'broker.sqlite3'} ({size} bytes)"
        for size in [(target / "broker.sqlite3").stat().st_size]
    ]
    return before, after


def test_a_backup_under_a_committing_writer_is_a_consistent_database(
    live: Live, tmp_path: Path
) -> None:
    """Row 290: each copy passes integrity_check and holds an unbroken prefix of the
    writer's commits, at least those made before the backup began; the writer never
    stopped (it committed more after); no partial file is left in the directory."""
    target = tmp_path / "backup"
    before, after = take_backup(live, target)
    wait_until(lambda: live.events() > after, 30, "the writer to keep committing")
    assert sorted(p.name for p in target.iterdir()) == ["broker.sqlite3", "db.sqlite3"]
    for copy in target.iterdir():
        conn = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        finally:
            conn.close()
        assert not copy.with_name(copy.name + "-wal").exists()
        assert copy.stat().st_mode & 0o777 == 0o600
    conn = sqlite3.connect(target / "broker.sqlite3")
    try:
        numbers = [json.loads(p)["n"] for (p,) in conn.execute("SELECT payload FROM jobs")]
    finally:
        conn.close()
    assert before <= len(numbers) <= after
    assert sorted(numbers) == list(range(len(numbers)))
    stats = count(target / "db.sqlite3", "function_stats")
    assert stats >= before - 1  # the writer upserts each event's row right after it


def test_an_existing_backup_is_refused_without_force_and_replaced_with_it(
    live: Live, tmp_path: Path
) -> None:
    """Row 291: one line, exit 1, the old copy untouched; --force replaces it."""
    target = tmp_path / "backup"
    take_backup(live, target)
    old = (target / "broker.sqlite3").read_bytes()
    kept = count(target / "broker.sqlite3", "jobs")
    refused = run_relay(["backup", str(target)], live.env)
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert refused.stderr == (
        f"relay: {target / 'db.sqlite3'} already exists; pass --force to overwrite it"
        " or choose a new directory\n"
    )
    assert (target / "broker.sqlite3").read_bytes() == old
    wait_until(lambda: live.events() > kept, 30, "the writer to commit more")
    forced = run_relay(["backup", str(target), "--force"], live.env)
    assert forced.returncode == 0, forced.stderr
    assert count(target / "broker.sqlite3", "jobs") > kept


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("no-state", "relay: {state}/db.sqlite3 does not exist (nothing to back up there)\n"),
        ("file", "relay: {target} exists and is not a directory\n"),
    ],
)
def test_backup_errors_are_one_line_and_write_nothing(
    tmp_path: Path, setup: str, expected: str
) -> None:
    """Row 292: a missing source or a PATH that is a file: one line, exit 1, and no
    directory or file is created."""
    state, target = tmp_path / "state", tmp_path / "backup"
    if setup == "file":
        state.mkdir()
        sqlite3.connect(state / "db.sqlite3").close()
        target.write_text("not a directory")
    env = {"RELAY_STATE_DIR": str(state), "RELAY_BROKER": "redis"}
    done = run_relay(["backup", str(target)], env)
    assert done.returncode == 1
    assert done.stderr == expected.format(state=state, target=target)
    assert target.is_file() if setup == "file" else not target.exists()


@pytest.mark.docker
def test_a_worker_restored_from_a_backup_starts(
    live: Live, tmp_path: Path, unique: str
) -> None:
    """The restore of docs/operations.md: copy the two files back (no -wal beside
    them), start: the worker opens both and finds the backed-up events queued."""
    target = tmp_path / "backup"
    take_backup(live, target)
    restored = tmp_path / "restored"
    worker = RelayWorker(restored, restored / "functions", {})
    worker.functions.mkdir(parents=True)
    worker.state_dir.mkdir()
    shutil.copy2(target / "db.sqlite3", worker.state_dir / "db.sqlite3")
    shutil.copy2(target / "broker.sqlite3", restored / "broker.sqlite3")
    worker.env = {
        **{k: v for k, v in worker.env.items() if not k.startswith("REDIS_")},
        "RELAY_BROKER": "sqlite",
        "RELAY_BROKER_PATH": str(restored / "broker.sqlite3"),
        "RELAY_HOSTNAME": f"restored-{unique}",
        "SHUTDOWN_GRACE": "5s",
    }
    queued = count(restored / "broker.sqlite3", "jobs")
    try:
        worker.start()
        # no function matches the restored events: the worker reads and acknowledges them
        wait_until(
            lambda: acked(restored / "broker.sqlite3") > 0, 60, "a restored event to be read"
        )
        assert count(restored / "broker.sqlite3", "jobs") == queued
    finally:
        assert worker.stop(timeout=30) == 0


def acked(path: Path) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM jobs WHERE state = 'acked'").fetchone()[0])
    finally:
        conn.close()


def test_on_redis_the_state_database_alone_is_backed_up(tmp_path: Path) -> None:
    """With RELAY_BROKER=redis (the default) the queue is Redis's to back up: no
    REDIS_URI is asked for, and the backup holds the state database only."""
    state, target = tmp_path / "state", tmp_path / "backup"
    state.mkdir()
    conn = sqlite3.connect(state / "db.sqlite3")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.execute("INSERT INTO t VALUES (1)")
    conn.commit()
    try:
        env = {"RELAY_STATE_DIR": str(state), "RELAY_BROKER": "redis"}
        done = run_relay(["backup", str(target)], env)
    finally:
        conn.close()
    assert done.returncode == 0, done.stderr
    assert [p.name for p in target.iterdir()] == ["db.sqlite3"]
    assert count(target / "db.sqlite3", "t") == 1
