"""The ``stats`` and ``function_stats`` rows of the state database.

Each row's ``data`` is a JSON document of counters (absent keys read as zero);
a function's row also holds its ``Last*`` execution timestamps as RFC3339 UTC
strings (``last_matched_at``, ``last_success_at``, ``last_failure_at``,
``last_dlq_at``; absent until set). A save replaces the global row and every
listed function's row in one transaction; a reset zeroes counters and removes the
timestamps in the existing rows (never deletes them) and keeps the backlog
gauges, which the next flush refreshes.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import anyio

from relay.adapters.sqlite.db import DATA_IN, StateDatabase, parse_rfc3339, rfc3339
from relay.domain.stats import (
    BACKLOG_GAUGES,
    FUNCTION_COUNTERS,
    FUNCTION_TIMESTAMPS,
    GLOBAL_COUNTERS,
    GLOBAL_KEYS,
    StatsSnapshot,
    zeroed,
)

_SAVE_GLOBAL = (
    f"INSERT INTO stats (id, data, updated_at) VALUES (1, {DATA_IN}, ?) "  # noqa: S608 - constant
    "ON CONFLICT(id) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at"
)
_SAVE_FUNCTION = (
    "INSERT INTO function_stats (function_name, data, updated_at) "  # noqa: S608 - constant
    f"VALUES (?, {DATA_IN}, ?) "
    "ON CONFLICT(function_name) DO UPDATE SET "
    "data = excluded.data, updated_at = excluded.updated_at"
)


class SqliteStatsStore:
    """The :class:`~relay.application.ports.StatsStore` over a :class:`StateDatabase`."""

    def __init__(self, db: StateDatabase) -> None:
        self._db = db

    async def load(self) -> StatsSnapshot:
        return await anyio.to_thread.run_sync(read_stats, self._db)

    async def save(self, snapshot: StatsSnapshot, at: float) -> None:
        await anyio.to_thread.run_sync(write_stats, self._db, snapshot, at)

    async def reset(self, at: float) -> None:
        await anyio.to_thread.run_sync(reset_stats, self._db, at)


def read_stats(db: StateDatabase) -> StatsSnapshot:
    """The persisted snapshot (blocking); zeros and ``updated_at=None`` when empty."""
    row = db.stats_row()
    totals: dict[str, int] = {}
    updated_at = None
    if row is not None:
        data, stamp = row
        totals = {key: _number(data.get(key)) for key in GLOBAL_KEYS}
        updated_at = parse_rfc3339(stamp)
    functions: dict[str, dict[str, int]] = {}
    timestamps: dict[str, dict[str, float]] = {}
    for name, data, _stamp in db.rows("function_stats"):
        functions[name] = {key: _number(data.get(key)) for key in FUNCTION_COUNTERS}
        last = _timestamps(data)
        if last:
            timestamps[name] = last
    return StatsSnapshot(
        totals=totals, functions=functions, updated_at=updated_at, timestamps=timestamps
    )


def write_stats(db: StateDatabase, snapshot: StatsSnapshot, at: float) -> None:
    """Replace the global row and each function's row in one transaction (blocking)."""
    stamp = rfc3339(at)
    with db.transaction() as conn:
        _write(conn, snapshot, stamp)


def reset_stats(db: StateDatabase, at: float) -> None:
    """Zero every counter in the existing rows, keeping the backlog gauges (blocking)."""
    stamp = rfc3339(at)
    current = read_stats(db)
    with db.transaction() as conn:
        _write(conn, zeroed(current), stamp)


def _write(conn: sqlite3.Connection, snapshot: StatsSnapshot, stamp: str) -> None:
    totals = {key: snapshot.total(key) for key in (*GLOBAL_COUNTERS, *BACKLOG_GAUGES)}
    conn.execute(_SAVE_GLOBAL, (_json(totals), stamp))
    for name in snapshot.function_names():
        data: dict[str, Any] = dict(snapshot.function(name))
        data.update({key: rfc3339(at) for key, at in snapshot.last(name).items()})
        conn.execute(_SAVE_FUNCTION, (name, _json(data), stamp))


def _timestamps(data: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key in FUNCTION_TIMESTAMPS:
        value = data.get(key)
        at = parse_rfc3339(value) if isinstance(value, str) else None
        if at is not None:
            out[key] = at
    return out


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True)


def _number(value: object) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int | float):
        return max(0, int(value))
    return 0
