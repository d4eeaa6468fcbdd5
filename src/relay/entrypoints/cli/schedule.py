"""``relay schedule ls``: every schedule of every function, its last and next occurrence.

The schedules come from the state database (what the worker loaded); the last
published occurrence of each is read from the broker's publish-if-new records,
kept 7 days: Redis's dedup keys of ``REDIS_STREAM``
(``relay:occurrence:<stream>:schedule:<function>:<handler>:<scheduled_at>``, and the
previous layout's unscoped ``relay:schedule:...``), or with
``RELAY_BROKER=sqlite`` the broker file's ``occurrences`` table. An unreachable
broker shows ``unknown`` there and one line says why; the rest still prints.
Read-only.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import typer

from relay.adapters.sqlite.db import open_db_readonly
from relay.domain import schedule
from relay.domain.errors import RelayError
from relay.domain.schedule import INSTANT_LENGTH
from relay.entrypoints.cli.common import fail, out
from relay.entrypoints.cli.fire_times import next_fire_at, next_fire_text
from relay.entrypoints.cli.fn_catalog import FunctionsOption
from relay.entrypoints.cli.json_output import JsonFlag, emit_json
from relay.entrypoints.config import load_broker_settings, load_paths

app = typer.Typer(help="Inspect cron schedules.", no_args_is_help=True)


@app.command("ls")
def ls(as_json: JsonFlag = False, functions: FunctionsOption = None) -> None:
    """List every schedule with its last published and next occurrence."""
    if functions is not None:
        _ls_offline(Path(functions), as_json=as_json)
        return
    rows = _schedules()
    prefixes = [schedule.schedule_prefix(fn, str(s.get("handler", ""))) for fn, s in rows]
    last: dict[str, str] | None
    problem: str | None = None
    try:
        last = anyio.run(_latest, prefixes) if rows else {}
    except RelayError as exc:
        problem = f"last published occurrences unknown: {exc}"
        typer.echo(f"relay: {problem}", err=True)
        last = None
    if as_json:
        emit_json("schedule.ls", schedules_document(rows, last, problem, time.time()))
        return
    for line in render_schedules(rows, last, time.time()):
        out(line)


def _ls_offline(directory: Path, *, as_json: bool) -> None:
    """The schedules of a directory's valid functions; the broker is not read."""
    from relay.entrypoints.cli import offline_catalog

    loaded = offline_catalog.loaded_functions(directory)
    offline_catalog.warn_invalid(loaded, directory)
    rows = offline_catalog.schedule_rows(loaded)
    if as_json:
        document = schedules_document(rows, None, offline_catalog.NOT_READ, time.time())
        emit_json("schedule.ls", document)
        return
    for line in render_schedules(rows, None, time.time()):
        out(line)


def schedules_document(
    rows: Sequence[tuple[str, Mapping[str, Any]]],
    last: Mapping[str, str] | None,
    problem: str | None,
    now: float,
) -> dict[str, Any]:
    """``relay.schedule.ls/1``: ``last_published`` is ``null`` when never published
    (in the 7 days the publish-if-new records live) or when the broker could not be
    read, which ``last_published_error`` then says."""
    schedules = []
    for function, s in rows:
        handler, cron = str(s.get("handler", "")), str(s.get("cron", ""))
        zone = str(s.get("timezone") or "UTC")
        occurrence = (last or {}).get(schedule.schedule_prefix(function, handler))
        schedules.append({
            "function": function,
            "handler": handler,
            "cron": cron,
            "timezone": zone,
            "last_published": occurrence[-INSTANT_LENGTH:] if occurrence else None,
            "next_at": next_fire_at(cron, zone, now),
        })
    return {"schedules": schedules, "last_published_error": problem}


def _schedules() -> list[tuple[str, Mapping[str, Any]]]:
    path = load_paths(os.environ).database
    try:
        db = open_db_readonly(path)
        found = [] if db is None else db.rows("functions")
    except sqlite3.Error as exc:
        fail(f"cannot read the state database {path}: {exc}")
    if db is not None:
        db.close()
    rows: list[tuple[str, Mapping[str, Any]]] = []
    for name, data, _updated in sorted(found, key=lambda r: str(r[0])):
        rows += [(str(name), s) for s in (data.get("schedules") or [])]
    return rows


async def _latest(prefixes: Sequence[str]) -> dict[str, str]:
    # the dedup records are per stream (REDIS_STREAM; on the embedded broker its default)
    broker, settings = load_broker_settings(os.environ, need_stream=True, need_group=False)
    # the broker's reader is imported when it is opened: `relay schedule --help` needs none
    from relay.adapters.admin import open_admin_broker

    async with open_admin_broker(broker, settings) as admin:
        return await admin.latest_published(prefixes)


def render_schedules(
    rows: Sequence[tuple[str, Mapping[str, Any]]], last: Mapping[str, str] | None, now: float
) -> list[str]:
    """The table; ``last`` is ``None`` when the broker could not be read."""
    if not rows:
        return ["no schedules"]
    table = [("SCHEDULE", "CRON", "TIMEZONE", "LAST PUBLISHED", "NEXT")]
    for function, s in rows:
        handler, cron = str(s.get("handler", "")), str(s.get("cron", ""))
        zone = str(s.get("timezone") or "UTC")
        prefix = schedule.schedule_prefix(function, handler)
        if last is None:
            published = "unknown"
        else:
            occurrence = last.get(prefix)
            published = occurrence[-INSTANT_LENGTH:] if occurrence else "-"
        upcoming = next_fire_text(cron, zone, now) or "-"
        table.append((f"{function}/{handler}", cron, zone, published, upcoming))
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    return [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r[:4])) + "  " + r[4]
        for r in table
    ]
