"""``relay stats`` and ``relay stats reset``.

``relay stats`` reads the state database only (no Redis, Docker or worker): the
snapshot the worker flushes every 5 seconds. ``relay stats reset`` goes through
the running worker's control socket, so the worker records the reset baseline
under its flush lock; only when no worker runs at all does it rewrite the
database directly, and says so on stderr.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import typer

from relay.adapters.control.client import WorkerUnavailable, request
from relay.adapters.sqlite.db import open_db, open_db_readonly, process_stats_paths, rfc3339
from relay.adapters.sqlite.stats_store import read_stats, reset_stats
from relay.domain.commands import ResetStats
from relay.domain.durations import format_age
from relay.domain.errors import RelayError
from relay.domain.stats import GLOBAL_KEYS, StatsSnapshot, combined
from relay.entrypoints.cli.common import EXIT_USAGE, fail, note, out
from relay.entrypoints.cli.fn_catalog import age
from relay.entrypoints.cli.json_output import JsonFlag, emit_json
from relay.entrypoints.config import Paths, load_paths

app = typer.Typer(help="Show or reset operational statistics.", invoke_without_command=True)

_LABEL = 21  # "Oldest pending age:  ": every value starts in this column
_COUNTERS = (
    ("Events received:", "events_received"),
    ("Events matched:", "events_matched"),
    ("Events unmatched:", "events_unmatched"),
    ("Handler successes:", "handler_success"),
    ("Handler failures:", "handler_failure"),
    ("Retries:", "retries"),
    ("DLQ entries:", "dlq_entries"),
    ("Pending entries:", "pending_entries"),
)


@app.callback()
def show(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Show the latest persisted statistics."""
    if ctx.invoked_subcommand is not None:
        if as_json:  # `relay stats --json reset`: reset prints no document
            fail("--json applies to `relay stats`, not to `relay stats reset`", EXIT_USAGE)
        return
    paths = load_paths(os.environ)
    snapshot = combined([_read(path) for path in _stats_files(paths)])
    if as_json:
        emit_json("stats", stats_document(snapshot))
        return
    for line in render_stats(snapshot, time.time()):
        out(line)


@app.command("reset")
def reset() -> None:
    """Zero the persisted cumulative statistics."""
    paths = load_paths(os.environ)
    try:
        for socket in paths.sockets:  # each process of `relay start --processes N`
            request(socket, ResetStats())
    except WorkerUnavailable as exc:
        if not exc.absent:  # a worker runs: never rewrite its counters underneath it
            fail(str(exc))
        for path in _stats_files(paths):
            _reset_offline(path)
        out("Statistics reset")
        note("no worker is running: the state database was reset directly")
        return
    except RelayError as exc:
        fail(str(exc))
    out("Statistics reset")


def _stats_files(paths: Paths) -> list[Path]:
    """The state database's stats, and one file per extra process of ``relay start
    --processes N`` (``relay stats`` adds them up)."""
    return [paths.database, *process_stats_paths(paths.state_dir)]


def _read(path: Path) -> StatsSnapshot:
    try:
        db = open_db_readonly(path)
        if db is None:
            return StatsSnapshot()
        try:
            return read_stats(db)
        finally:
            db.close()
    except sqlite3.Error as exc:
        fail(f"cannot read the state database {path}: {exc}")


def _reset_offline(path: Path) -> None:
    if not path.is_file():
        return  # nothing persisted yet: already zero
    try:
        db = open_db(path)
        try:
            reset_stats(db, time.time())
        finally:
            db.close()
    except (sqlite3.Error, OSError) as exc:
        fail(f"cannot reset the state database {path}: {exc}")


def render_stats(snapshot: StatsSnapshot, now: float) -> list[str]:
    """The ``relay stats`` lines: zeros and ``Updated: never`` for a fresh database;
    ``Delayed entries:`` (delayed events not due yet) only when there are some."""
    lines = [_line(label, str(snapshot.total(key))) for label, key in _COUNTERS]
    delayed = snapshot.total("delayed_entries")
    if delayed:  # only then: the spec's block is unchanged for a broker with none
        lines.append(_line("Delayed entries:", str(delayed)))
    lines.append(
        _line("Oldest pending age:", format_age(snapshot.total("oldest_pending_age_seconds")))
    )
    updated = "never" if snapshot.updated_at is None else age(snapshot.updated_at, now)
    lines.append(_line("Updated:", updated))
    return lines


def stats_document(snapshot: StatsSnapshot) -> dict[str, object]:
    """``relay.stats/1``: every global counter and backlog gauge (zeros for a fresh
    database) and when the worker last persisted them (``null``: never)."""
    return {
        **{key: snapshot.total(key) for key in GLOBAL_KEYS},
        "updated_at": None if snapshot.updated_at is None else rfc3339(snapshot.updated_at),
    }


def _line(label: str, value: str) -> str:
    return f"{label:<{_LABEL}}{value}"
