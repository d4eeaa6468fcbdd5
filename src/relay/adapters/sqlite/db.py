"""The local state database: ``<state dir>/db.sqlite3``.

A read-only view of what the worker has loaded (``functions``) and its latest
operational snapshots (``stats``, ``function_stats``); never a source of truth.
Only stable keys are columns; each row's evolving payload is one JSON document
in ``data``, stored as SQLite's binary JSON (``jsonb(?)`` on write,
``json(data)`` on read) when the linked SQLite has it (3.45+). Older SQLite
libraries store the same document as JSON text in the same column; ``json(data)``
reads both, so the choice is invisible to readers.

Every call here is blocking: async code runs it in a worker thread
(:func:`anyio.to_thread.run_sync`). The connection is shared across those threads
and serialised by a lock.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from relay.adapters.fs.private import private_directory, private_file, tighten_if_present

DB_FILENAME = "db.sqlite3"

JSONB_SUPPORTED = sqlite3.sqlite_version_info >= (3, 45, 0)
"""Whether the linked SQLite stores binary JSON; otherwise payloads are JSON text."""

DATA_IN = "jsonb(?)" if JSONB_SUPPORTED else "json(?)"
"""SQL for a JSON payload parameter on write (use in place of ``?``)."""

DATA_OUT = "json(data)"
"""SQL that reads the ``data`` column back as JSON text."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS functions (
    name TEXT PRIMARY KEY,
    data BLOB NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS stats (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    updated_at TEXT NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS function_stats (
    function_name TEXT PRIMARY KEY,
    updated_at TEXT NOT NULL,
    data BLOB NOT NULL
);
"""


def db_path(state_dir: Path) -> Path:
    """Where the state database lives under a state directory."""
    return state_dir / DB_FILENAME


def rfc3339(epoch_s: float) -> str:
    """UTC RFC3339 with second precision, the format of every stored timestamp."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float | None:
    """Seconds since the epoch, or ``None`` for an empty or unreadable value."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class StateDatabase:
    """One open connection to the state database, safe to use from worker threads."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._conn = connection
        self._lock = threading.Lock()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection inside one transaction (committed on success)."""
        with self._lock, self._conn:
            yield self._conn

    def upsert(self, table: str, key: str, data: dict[str, Any], updated_at: str) -> None:
        """Replace one row of ``functions``/``function_stats`` (keyed by name)."""
        column = _KEY_COLUMNS[table]
        with self.transaction() as conn:
            conn.execute(
                f"INSERT INTO {table} ({column}, data, updated_at) "  # noqa: S608 - fixed names
                f"VALUES (?, {DATA_IN}, ?) ON CONFLICT({column}) DO UPDATE SET "
                "data = excluded.data, updated_at = excluded.updated_at",
                (key, json.dumps(data, sort_keys=True), updated_at),
            )

    def delete(self, table: str, key: str) -> None:
        column = _KEY_COLUMNS[table]
        with self.transaction() as conn:
            conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (key,))  # noqa: S608

    def rows(self, table: str) -> list[tuple[str, dict[str, Any], str]]:
        """Every ``(key, data, updated_at)`` of a keyed table, sorted by key."""
        column = _KEY_COLUMNS[table]
        with self.transaction() as conn:
            found = conn.execute(
                f"SELECT {column}, {DATA_OUT}, updated_at FROM {table} "  # noqa: S608
                f"ORDER BY {column}"
            ).fetchall()
        return [(key, _decode(raw), updated) for key, raw, updated in found]

    def row(self, table: str, key: str) -> tuple[dict[str, Any], str] | None:
        """One row's ``(data, updated_at)``, or ``None``."""
        column = _KEY_COLUMNS[table]
        with self.transaction() as conn:
            found = conn.execute(
                f"SELECT {DATA_OUT}, updated_at FROM {table} WHERE {column} = ?",  # noqa: S608
                (key,),
            ).fetchone()
        return None if found is None else (_decode(found[0]), found[1])

    def stats_row(self) -> tuple[dict[str, Any], str] | None:
        """The global ``stats`` row's ``(data, updated_at)``, or ``None``."""
        with self.transaction() as conn:
            found = conn.execute(
                f"SELECT {DATA_OUT}, updated_at FROM stats WHERE id = 1"  # noqa: S608
            ).fetchone()
        return None if found is None else (_decode(found[0]), found[1])

    def close(self) -> None:
        with self._lock:
            self._conn.close()


# Table and column names in the SQL above come only from this fixed map and the
# module constants, never from input (hence the S608 ignores).
_KEY_COLUMNS = {"functions": "name", "function_stats": "function_name"}


def _decode(raw: str | None) -> dict[str, Any]:
    """A stored payload; anything unreadable decodes to empty (absent fields are zero)."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


PROCESSES_DIR = "processes"  # under the state directory: one stats file per extra process


def process_stats_path(state_dir: Path, process: int) -> Path:
    """The stats file of process ``process`` (1..N-1) of ``relay start --processes N``."""
    return state_dir / PROCESSES_DIR / f"{process}.sqlite3"


def process_stats_paths(state_dir: Path) -> list[Path]:
    """Every such file there is (``relay stats`` adds them to the state database's)."""
    folder = state_dir / PROCESSES_DIR
    if not folder.is_dir():
        return []
    return sorted(folder.glob("*.sqlite3"))


def open_db(path: Path) -> StateDatabase:
    """Open (creating the parent directory, the file and the schema) in WAL mode.

    The directories Relay creates are 0700 and the database 0600, whatever the
    umask: it holds env values and errors. SQLite gives its ``-wal`` and ``-shm``
    files the database's mode; ones left by an older, looser run are tightened.
    Raises ``sqlite3.Error`` or ``OSError``; callers treat both as non-fatal.
    """
    private_directory(path.parent)
    private_file(path)
    for suffix in ("-wal", "-shm"):
        tighten_if_present(path.with_name(path.name + suffix))
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.executescript(_SCHEMA)
    except sqlite3.Error:
        conn.close()
        raise
    # isolation_level=None for the pragmas above; from now on, explicit transactions.
    conn.isolation_level = "DEFERRED"
    return StateDatabase(path, conn)


def open_db_readonly(path: Path) -> StateDatabase | None:
    """Open an existing database for reading only (the CLI); ``None`` when missing.

    Never creates the file or its directory: reading must leave no trace.
    """
    if not path.is_file():
        return None
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=5000")
    return StateDatabase(path, conn)
