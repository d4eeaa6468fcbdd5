"""Taking the broker file's write lock fairly between processes sharing the file.

``BEGIN IMMEDIATE`` takes SQLite's write lock; a process finding it held used to
wait in SQLite's own busy handler, which sleeps longer after each failed try (1,
2, 5, 10 ... up to 100 ms a try). Two worker processes on one file then did not
share it: the one holding the lock took it again right after its ``COMMIT``
while the other slept, so the other's begins came tens of milliseconds late and
found the jobs they had peeked taken and often already settled (most of a burst
run by one process, the other's reads wasted: row 350).

Here the writer's connection does not wait in SQLite (``busy_timeout = 0``):
:meth:`WriteLock.begin` tries again every :data:`POLL_S` until
:data:`~relay.adapters.sqlite.broker.file.BUSY_TIMEOUT_MS`, and a process that
had to wait for its last transaction (another process is writing too) lets
:data:`POLL_S` pass after its ``COMMIT`` before its next ``BEGIN``, so the
waiting one finds the lock free on its next try: the two take turns. A process
alone on the file never waits and never yields.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Final

from relay.adapters.sqlite.broker.file import BUSY_TIMEOUT_MS

POLL_S: Final = 0.0005


def _busy(exc: sqlite3.OperationalError) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}


class WriteLock:
    """The writer thread's way into a transaction (writer thread only)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        conn.execute("PRAGMA busy_timeout = 0")  # the waiting is ours (see the module)
        self._shared = False  # the last transaction had to wait for another process

    def begin(self) -> None:
        """``BEGIN IMMEDIATE``, waiting for another process's transaction to end
        (a busy file past the timeout raises as SQLite's own wait would)."""
        if self._shared:
            time.sleep(POLL_S)  # the other process's turn
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        waited = False
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() >= deadline:
                    raise
                waited = True
                time.sleep(POLL_S)
                continue
            self._shared = waited
            return
