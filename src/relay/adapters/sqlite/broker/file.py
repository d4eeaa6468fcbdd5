"""The embedded broker's file: its schema, and opening it (pragmas, privacy, the
integrity check).

WAL mode, ``synchronous=FULL`` (never weakened). A corrupt file is detected at
open (``PRAGMA quick_check``) and refused with one line; it is never recreated
behind the user's back.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

from relay.adapters.fs.private import private_directory, private_file, tighten_if_present
from relay.domain.errors import DependencyUnavailable, RelayError

BUSY_TIMEOUT_MS: Final = 10_000

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    stream TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    priority INTEGER NOT NULL DEFAULT 2,
    payload BLOB,
    state TEXT NOT NULL DEFAULT 'ready' CHECK (state IN ('ready', 'leased', 'acked')),
    token TEXT,
    consumer TEXT,
    leased_ms INTEGER,
    deliveries INTEGER NOT NULL DEFAULT 0,
    expires_ms INTEGER,
    traceparent TEXT,
    ready_ms INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_ready ON jobs (stream, priority, created_ms, seq)
    WHERE state = 'ready' AND ready_ms IS NULL;
CREATE INDEX IF NOT EXISTS jobs_delayed ON jobs (stream, priority, ready_ms, seq)
    WHERE state = 'ready' AND ready_ms IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_leased ON jobs (stream, leased_ms) WHERE state = 'leased';
CREATE INDEX IF NOT EXISTS jobs_acked ON jobs (expires_ms) WHERE state = 'acked';
CREATE TABLE IF NOT EXISTS ledger (
    seq INTEGER NOT NULL,
    field TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (seq, field)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dlq (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    created_ms INTEGER NOT NULL,
    original_stream TEXT NOT NULL,
    original_id TEXT NOT NULL,
    grp TEXT NOT NULL,
    consumer TEXT NOT NULL,
    event TEXT NOT NULL,
    reason TEXT NOT NULL,
    function TEXT NOT NULL,
    handler TEXT NOT NULL,
    deliveries INTEGER NOT NULL,
    handler_attempts INTEGER NOT NULL,
    timestamp TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS occurrences (
    id TEXT PRIMARY KEY,
    message_id TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS occurrences_expiry ON occurrences (expires_ms);
"""


class CorruptBroker(RelayError):
    """The broker file fails SQLite's integrity check (or is not a database)."""


def connect(path: Path) -> sqlite3.Connection:
    """A connection with the broker's pragmas, in autocommit (transactions are ours)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def open_checked(path: Path) -> sqlite3.Connection:
    """Open (creating when absent) and check the file; raises :class:`CorruptBroker`
    with one line naming the file, or ``DependencyUnavailable`` when it cannot be
    opened at all. The file holds event payloads: like the state database it is
    0600 (and directories Relay creates 0700), whatever the umask."""
    try:
        existed = path.exists() and path.stat().st_size > 0
        private_directory(path.parent)
        private_file(path)
        for suffix in ("-wal", "-shm"):
            tighten_if_present(path.with_name(path.name + suffix))
    except OSError as exc:
        raise DependencyUnavailable(f"broker file {path}: {exc.strerror or exc}") from exc
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=0)
    except sqlite3.Error as exc:
        raise DependencyUnavailable(f"broker file {path}: cannot open: {exc}") from exc
    try:
        if existed:
            _quick_check(conn, path)
        conn.close()
        conn = connect(path)
        _migrate(conn)
        conn.executescript(SCHEMA)
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise _corrupt(path, str(exc)) from exc
    return conn


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a file of an earlier version up to :data:`SCHEMA`, once, under the
    write lock (another process may open it at the same moment); columns added
    since are added with no default, so old rows read as before:

    - ``jobs.ready_ms`` (issue 33, delayed events): a delayed job's due time
      (``NULL`` for every other job), and two ready ranges per class instead of
      one: ``jobs_ready`` (now without delayed jobs, in publish order, as before)
      and ``jobs_delayed`` (in due order, read up to now). The old ``jobs_ready``
      is dropped here; ``SCHEMA`` creates both.
    - ``jobs.traceparent`` (issue 34): the producer's W3C trace context."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        if columns and "ready_ms" not in columns:
            conn.execute("ALTER TABLE jobs ADD COLUMN ready_ms INTEGER")
            conn.execute("DROP INDEX IF EXISTS jobs_ready")
        if columns and "traceparent" not in columns:
            conn.execute("ALTER TABLE jobs ADD COLUMN traceparent TEXT")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _quick_check(conn: sqlite3.Connection, path: Path) -> None:
    rows = conn.execute("PRAGMA quick_check").fetchall()
    problems = [str(r[0]) for r in rows if r[0] != "ok"]
    if problems:
        raise _corrupt(path, problems[0])


def _corrupt(path: Path, why: str) -> CorruptBroker:
    return CorruptBroker(
        f"broker file {path} is corrupt ({why.splitlines()[0][:120]}); it was left as it is:"
        " restore it from a backup or move it aside to start with an empty queue"
    )
