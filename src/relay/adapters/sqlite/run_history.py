"""The run history and per-minute rollups in the state database, off the hot path.

A bus subscriber (:meth:`RunHistory.subscribe`) turns the invocation events into
small items on a bounded queue: appending is all the delivery path pays, and a
full queue drops the item and counts it (``dropped``) instead of waiting. The
:meth:`RunHistory.run` loop drains the queue every ``flush_s`` and writes one
transaction per batch in a worker thread: the runs, the rollup minutes that
changed (counts are added, so several processes may share the file), then the
pruning (the newest ``limit`` runs within ``retention_s``; rollups within
``rollup_retention_s``). Nothing reads these tables to decide delivery, and a
database error is logged once and the batch dropped: Relay runs on without it.
"""

from __future__ import annotations

import sqlite3
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import structlog
from anyio.abc import TaskStatus

from relay.adapters.sqlite.db import StateDatabase, open_db
from relay.application.bus import MessageBus
from relay.domain import events as ev
from relay.domain import run_history as rh

_log = structlog.get_logger(__name__)

FLUSH_S = 1.0
OPEN_MINUTES = 2
"""Minutes kept in memory after they end: a late event still lands in its minute."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    function TEXT NOT NULL,
    handler TEXT NOT NULL,
    outcome TEXT NOT NULL,
    duration_s REAL NOT NULL,
    message_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    error TEXT NOT NULL,
    kind TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_at ON runs (at);
CREATE TABLE IF NOT EXISTS run_rollups (
    minute INTEGER NOT NULL,
    function TEXT NOT NULL,
    received INTEGER NOT NULL DEFAULT 0,
    succeeded INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    dead_lettered INTEGER NOT NULL DEFAULT 0,
    p50_s REAL,
    p99_s REAL,
    PRIMARY KEY (minute, function)
);
"""

_INSERT_RUN = (
    "INSERT INTO runs (at, function, handler, outcome, duration_s, message_id, attempt,"
    " error, kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_ADD_ROLLUP = (
    "INSERT INTO run_rollups (minute, function, received, succeeded, failed, dead_lettered,"
    " p50_s, p99_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (minute, function) DO UPDATE SET"
    " received = received + excluded.received, succeeded = succeeded + excluded.succeeded,"
    " failed = failed + excluded.failed, dead_lettered = dead_lettered + excluded.dead_lettered,"
    " p50_s = coalesce(excluded.p50_s, p50_s), p99_s = coalesce(excluded.p99_s, p99_s)"
)

# What the queue holds: a finished run, a received event, or a dead letter.
Item = rh.Run | tuple[str, float, Any]


@dataclass(frozen=True, slots=True)
class RunHistorySettings:
    limit: int = rh.DEFAULT_LIMIT
    retention_s: float = rh.DEFAULT_RETENTION_NS / 1e9
    rollup_retention_s: float = rh.DEFAULT_ROLLUP_RETENTION_NS / 1e9


@dataclass(frozen=True, slots=True)
class RollupRow:
    minute: int
    function: str
    received: int
    succeeded: int
    failed: int
    dead_lettered: int
    p50_s: float | None
    p99_s: float | None


class RunHistory:
    """The projection; see the module docstring."""

    def __init__(
        self,
        path: Path,
        settings: RunHistorySettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
        capacity: int = rh.QUEUE_CAPACITY,
        flush_s: float = FLUSH_S,
    ) -> None:
        self.path = path
        self.settings = settings or RunHistorySettings()
        self._clock = clock
        self._capacity = capacity
        self._flush_s = flush_s
        self._queue: deque[Item] = deque()
        self._rollups = rh.Rollups()
        self._written: dict[tuple[int, str], tuple[int, int, int, int]] = {}
        self._db: StateDatabase | None = None
        self._failing = False
        self.dropped = 0
        """Items dropped because the queue was full or their write failed."""

    # --- the subscriber side: called on the delivery path, must never wait -----
    def subscribe(self, bus: MessageBus) -> None:
        bus.subscribe(ev.EventClassified, self._classified)
        bus.subscribe(ev.InvocationSucceeded, self._succeeded)
        bus.subscribe(ev.InvocationFailed, self._failed)
        bus.subscribe(ev.InvocationExhausted, self._exhausted)
        bus.subscribe(ev.MessageDeadLettered, self._dead_lettered)
        bus.subscribe(ev.HandlerInvoked, self._invoked)

    def put(self, item: Item) -> None:
        if len(self._queue) >= self._capacity:
            if not self.dropped:
                _log.warning("run_history_queue_full", capacity=self._capacity,
                             detail="run history rows are dropped (counted); delivery goes on")
            self.dropped += 1
            return
        self._queue.append(item)

    def _classified(self, e: ev.EventClassified) -> None:
        self.put(("received", self._clock(), e.functions))

    def _dead_lettered(self, e: ev.MessageDeadLettered) -> None:
        self.put(("dlq", self._clock(), e.function))

    def _run(self, e: Any, outcome: str, error: str = "") -> None:
        self.put(rh.Run(
            at=self._clock(), function=e.function, handler=e.handler, outcome=outcome,
            duration_s=e.duration_s, message_id=e.message_id, attempt=e.attempt,
            error=rh.clip_error(error),
        ))

    def _succeeded(self, e: ev.InvocationSucceeded) -> None:
        self._run(e, rh.SUCCEEDED)

    def _failed(self, e: ev.InvocationFailed) -> None:
        self._run(e, rh.FAILED, e.error)

    def _exhausted(self, e: ev.InvocationExhausted) -> None:
        self._run(e, rh.EXHAUSTED, e.error)

    def _invoked(self, e: ev.HandlerInvoked) -> None:
        self.put(rh.Run(
            at=self._clock(), function=e.function, handler=e.handler,
            outcome=rh.SUCCEEDED if e.ok else rh.FAILED, duration_s=e.duration_s,
            error=rh.clip_error(e.error), kind=rh.MANUAL,
        ))

    # --- the writer side: a background task -----------------------------------
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                await anyio.sleep(self._flush_s)
                await self.flush()
        finally:
            with anyio.CancelScope(shield=True):
                await self.flush()
                await self.aclose()

    async def flush(self) -> int:
        """Write what is queued; the number of runs written."""
        runs, rollups = self._drain()
        if not runs and not rollups:
            return 0
        now = self._clock()
        try:
            await anyio.to_thread.run_sync(self._write, runs, rollups, now)
        except (sqlite3.Error, OSError) as exc:
            self.dropped += len(runs)
            if not self._failing:
                _log.warning("run_history_write_failed", path=str(self.path), error=str(exc))
            self._failing = True
            self._db = None
            return 0
        if self._failing:
            _log.info("run_history_write_recovered", path=str(self.path))
        self._failing = False
        return len(runs)

    def _drain(self) -> tuple[list[rh.Run], list[tuple[Any, ...]]]:
        runs: list[rh.Run] = []
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, rh.Run):
                runs.append(item)
                self._rollups.finished(item)
            elif item[0] == "received":
                self._rollups.received(item[1], item[2])
            else:
                self._rollups.dead_lettered(item[1], item[2])
        return runs, self._rollup_deltas()

    def _rollup_deltas(self) -> list[tuple[Any, ...]]:
        """Each changed minute's counts since its last write, with its percentiles."""
        rows = []
        for minute, function, bucket in self._rollups.items():
            counts = (bucket.received, bucket.succeeded, bucket.failed, bucket.dead_lettered)
            before = self._written.get((minute, function), (0, 0, 0, 0))
            if counts == before:
                continue
            self._written[(minute, function)] = counts
            delta = tuple(now - then for now, then in zip(counts, before, strict=True))
            rows.append((minute, function, *delta, *bucket.quantiles()))
        oldest_open = rh.minute_of(self._clock()) - OPEN_MINUTES * 60
        self._rollups.close_before(oldest_open)
        for key in [key for key in self._written if key[0] < oldest_open]:
            del self._written[key]
        return rows

    def _write(self, runs: list[rh.Run], rollups: list[tuple[Any, ...]], now: float) -> None:
        db = self._open()
        s = self.settings
        with db.transaction() as conn:
            conn.executemany(_INSERT_RUN, [
                (r.at, r.function, r.handler, r.outcome, r.duration_s, r.message_id,
                 r.attempt, r.error, r.kind) for r in runs
            ])
            conn.executemany(_ADD_ROLLUP, rollups)
            conn.execute("DELETE FROM runs WHERE at < ?", (now - s.retention_s,))
            conn.execute(
                "DELETE FROM runs WHERE id <= (SELECT max(id) FROM runs) - ?", (s.limit,)
            )
            conn.execute(
                "DELETE FROM run_rollups WHERE minute < ?", (now - s.rollup_retention_s,)
            )

    def _open(self) -> StateDatabase:
        if self._db is None or not self.path.exists():
            self._db = open_history_db(self.path)
        return self._db

    async def aclose(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await anyio.to_thread.run_sync(db.close)


def open_history_db(path: Path) -> StateDatabase:
    """The state database with the run history's tables (created if missing)."""
    db = open_db(path)
    with db.transaction() as conn:
        conn.executescript(SCHEMA)
    return db


# --- reads (blocking; the console runs them in a worker thread) --------------------
def recent_runs(
    db: StateDatabase,
    *,
    function: str | None = None,
    handler: str | None = None,
    outcome: str | None = None,
    limit: int = 200,
) -> list[rh.Run]:
    """The newest runs first, filtered by whichever of the three is given."""
    where, args = [], []
    for column, value in (("function", function), ("handler", handler), ("outcome", outcome)):
        if value:
            where.append(f"{column} = ?")
            args.append(value)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    # the clause joins fixed column names only; the values are parameters
    query = (
        "SELECT at, function, handler, outcome, duration_s, message_id, attempt, error, kind"  # noqa: S608
        f" FROM runs{clause} ORDER BY id DESC LIMIT ?"
    )
    with db.transaction() as conn:
        found = conn.execute(query, (*args, limit)).fetchall()
    return [
        rh.Run(at=r[0], function=r[1], handler=r[2], outcome=r[3], duration_s=r[4],
               message_id=r[5], attempt=r[6], error=r[7], kind=r[8])
        for r in found
    ]


def rollup_rows(db: StateDatabase, *, since: float, function: str = rh.ALL) -> list[RollupRow]:
    """One function's (or :data:`ALL`'s) minutes from ``since`` on, oldest first."""
    with db.transaction() as conn:
        found = conn.execute(
            "SELECT minute, function, received, succeeded, failed, dead_lettered, p50_s, p99_s"
            " FROM run_rollups WHERE function = ? AND minute >= ? ORDER BY minute",
            (function, rh.minute_of(since)),
        ).fetchall()
    return [RollupRow(*row) for row in found]


def run_names(db: StateDatabase) -> tuple[list[str], list[str]]:
    """The functions and handlers the kept runs name (the runs page's filters)."""
    with db.transaction() as conn:
        functions = [r[0] for r in conn.execute("SELECT DISTINCT function FROM runs ORDER BY 1")]
        handlers = [r[0] for r in conn.execute("SELECT DISTINCT handler FROM runs ORDER BY 1")]
    return functions, handlers
