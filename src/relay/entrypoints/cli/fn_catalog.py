"""``relay function ls`` and ``relay function inspect``: read the state database only.

Neither command needs Redis, Docker or the functions directory: they render the
rows the worker's state view wrote to ``<state dir>/db.sqlite3``. ``inspect``
additionally asks a running worker for its live pool gauges over the control
socket, and says ``unknown`` when no worker answers.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from relay.adapters.control.client import fetch_pool
from relay.adapters.sqlite.db import StateDatabase, open_db_readonly, parse_rfc3339
from relay.entrypoints.cli import cron_text
from relay.entrypoints.cli.breaker_view import breaker_lines, fetch_breaker
from relay.entrypoints.cli.common import fail, out
from relay.entrypoints.cli.fire_times import next_fire_text
from relay.entrypoints.cli.json_output import JsonFlag, emit_json
from relay.entrypoints.config import load_paths

_LABEL = 17  # "Last reconcile:  " — every inspect value starts in this column
_STATS = (
    ("Events matched:", "events_matched"),
    ("Handler successes:", "handler_success"),
    ("Handler failures:", "handler_failure"),
    ("Retries:", "retries"),
    ("DLQ entries:", "dlq_entries"),
)
# The per-function Last* execution timestamps: a line each, only when set.
_STATS_LAST = (
    ("Last matched:", "last_matched_at"),
    ("Last success:", "last_success_at"),
    ("Last failure:", "last_failure_at"),
    ("Last DLQ entry:", "last_dlq_at"),
)
_POOL_LIVE = (
    ("Capacity:", "capacity"),
    ("Containers:", "containers"),
    ("Busy:", "busy"),
    ("Idle:", "idle"),
)
_POOL_COUNTERS = (
    ("Warm acquires:", "warm_acquires"),
    ("Cold starts:", "cold_starts"),
    ("Discarded:", "discarded"),
)
_ABSOLUTE_AFTER_S = 30 * 86400
_DEFAULT_TIMEOUT = "6s"  # the template defaults: shown for events, omitted for schedules
_DEFAULT_RETRIES = 4


def register(app: typer.Typer) -> None:
    app.command("ls")(ls)
    app.command("inspect")(inspect_)


# A plain string, made a Path in the body: typer coerces a Path through pydantic,
# which alone cost `relay function ls` about 60 ms at start-up.
FunctionsOption = Annotated[
    str | None,
    typer.Option(
        "--functions", metavar="DIR",
        help="List this directory's functions instead, with no worker (see docs/cli.md).",
    ),
]


def ls(as_json: JsonFlag = False, functions: FunctionsOption = None) -> None:
    """List loaded functions."""
    if functions is not None:
        from relay.entrypoints.cli import offline_catalog

        directory = Path(functions)
        loaded = offline_catalog.loaded_functions(directory)
        offline_catalog.warn_invalid(loaded, directory)
        data: Sequence[Mapping[str, Any]] = offline_catalog.function_rows(loaded)
    else:
        db = _open()
        rows = [] if db is None else _read(db, lambda d: d.rows("functions"))
        data = [data for _name, data, _updated in rows]
    if as_json:
        from relay.entrypoints.cli.fn_catalog_json import ls_document

        emit_json("function.ls", ls_document(data))
        return
    for line in render_ls(data, time.time()):
        out(line)


def inspect_(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The function's name.")],
    as_json: JsonFlag = False,
) -> None:
    """Show one function's state, handlers, stats and runtime pool."""
    db = _open()
    found = None if db is None else _read(db, lambda d: d.row("functions", name))
    if found is None or db is None:
        fail(f'function "{name}" not found')
    stats = _read(db, lambda d: d.row("function_stats", name))
    paths = load_paths(os.environ)
    pool = fetch_pool(paths.socket, name)
    if as_json:
        from relay.entrypoints.cli.fn_catalog_json import inspect_document

        breaker = fetch_breaker(paths.socket, name)
        stat_row = stats[0] if stats else {}
        document = inspect_document(found[0], stat_row, pool, breaker, time.time())
        emit_json("function.inspect", document)
        return
    lines = render_inspect(found[0], stats[0] if stats else {}, pool, time.time())
    lines += breaker_lines(fetch_breaker(paths.socket, name), name)
    for line in lines:
        out(line)


# --- rendering (pure) ----------------------------------------------------------
def render_ls(rows: Sequence[Mapping[str, Any]], now: float) -> list[str]:
    """The ``ls`` table, sorted by name; the name column widens for long names."""
    rows = sorted(rows, key=lambda r: str(r.get("name", "")))
    width = max([20, *(len(str(r.get("name", ""))) for r in rows)]) + 1
    lines = [f"{'NAME':<{width}}{'RUNTIME':<12}{'STATUS':<8}UPDATED"]
    for row in rows:
        when = parse_rfc3339(str(row.get("prepared_at") or row.get("updated_at") or ""))
        updated = "-" if when is None else age(when, now)
        lines.append(
            f"{row.get('name', ''):<{width}}{row.get('runtime') or '-':<12}"
            f"{row.get('status', 'pending'):<8}{updated}"
        )
    return lines


def render_inspect(
    row: Mapping[str, Any],
    stats: Mapping[str, Any],
    pool: Mapping[str, Any] | None,
    now: float,
    describe: Callable[[str], str | None] | None = None,
) -> list[str]:
    """Every section of ``inspect``, in the spec's order."""
    lines = _header(row, now)
    lines += _events(row.get("handlers") or [])
    lines += _schedules(row.get("schedules") or [], describe or cron_text.describe, now)
    lines += _services(row.get("services") or [], row.get("service_state") or {})
    lines.append("Stats:")
    counts = [(label, _count(stats, key)) for label, key in _STATS]
    lines += _aligned(counts + _last_lines(stats, now))
    lines += _mapping("Environment:", row.get("env") or {})
    lines += _mapping("Secrets:", row.get("secrets") or {})
    lines.append("Runtime pool:")
    lines += _aligned(_pool_lines(stats, pool))
    return lines


def _header(row: Mapping[str, Any], now: float) -> list[str]:
    status = str(row.get("status", "pending"))
    fields: list[tuple[str, str]] = [
        ("Name:", str(row.get("name", ""))),
        ("Runtime:", str(row.get("runtime") or "-")),
        ("Status:", status),
    ]
    if status == "ready":
        prepared = str(row.get("prepared_at") or "")
        when = parse_rfc3339(prepared)
        fields += [
            ("Image:", str(row.get("image") or "-")),  # "-": build/image services only
            ("Fingerprint:", str(row.get("fingerprint") or "")),
            ("Prepared:", prepared if when is None else f"{prepared} ({age(when, now)})"),
        ]
    outcome = row.get("last_reconcile_status")
    if outcome:
        at = parse_rfc3339(str(row.get("last_reconcile_at") or ""))
        fields.append(("Last reconcile:", outcome if at is None else f"{outcome} ({age(at, now)})"))
    error = row.get("last_error")
    if error:
        fields.append(("Last error:", _first_line(str(error))))
    return [f"{label:<{_LABEL}}{value}" for label, value in fields]


def _events(handlers: list[Mapping[str, Any]]) -> list[str]:
    if not handlers:
        return []
    width = max(len(str(h.get("name", ""))) for h in handlers)
    lines = ["Events:"]
    for h in handlers:
        timeout = h.get("timeout", _DEFAULT_TIMEOUT)
        lines.append(f"  {h.get('name', ''):<{width}}  timeout={timeout}{_retries(h)}")
    return lines


def _schedules(
    schedules: list[Mapping[str, Any]], describe: Callable[[str], str | None], now: float
) -> list[str]:
    if not schedules:
        return []
    width = max(len(str(s.get("handler", ""))) for s in schedules)
    lines = ["Schedules:"]
    for s in schedules:
        cron = str(s.get("cron", ""))
        text = _safe_describe(describe, cron)
        parts = [f'cron="{cron}"' + (f" ({text})" if text else "")]
        parts.append(f"timezone={s.get('timezone') or 'UTC'}")
        timeout = str(s.get("timeout") or "")
        if timeout and timeout != _DEFAULT_TIMEOUT:
            parts.append(f"timeout={timeout}")
        parts += [f"{k}={s[k]}" for k, off in (("catchup", "0"), ("overlap", "allow"))
                  if s.get(k) not in (None, off)]  # fmt: skip
        lines.append(f"  {s.get('handler', ''):<{width}}  {' '.join(parts)}{_retries(s)}")
        upcoming = next_fire_text(cron, str(s.get("timezone") or "UTC"), now)
        if upcoming:
            lines.append(f"  {'':<{width}}  next: {upcoming}")
    return lines


def _services(
    services: list[Mapping[str, Any]], state: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """The spec's ``Services:`` block (``build:``/``image:`` prefixes, effective
    port and replicas), then each replica's state and a routed service's rule."""
    if not services:
        return []
    shown = []
    for s in services:
        kind = next((k for k in ("entrypoint", "build", "image") if s.get(k)), "entrypoint")
        source = str(s.get(kind, "?"))
        shown.append((source, source if kind == "entrypoint" else f"{kind}:{source}", s))
    width = max(len(display) for _, display, _ in shown)
    lines = ["Services:"]
    for source, display, s in shown:
        lines.append(
            f"  {display:<{width}}  port={s.get('port', 80)} replicas={s.get('replicas', 1)}"
        )
        known = state.get(source) or {}
        replicas = known.get("replicas")
        if replicas:
            lines.append(f"    replicas: {' '.join(str(r) for r in replicas)}")
        if known.get("rule"):
            lines.append(f"    rule: {known['rule']}")
        if known.get("error"):
            lines.append(f"    error: {known['error']}")
    return lines


def _mapping(title: str, values: Mapping[str, Any]) -> list[str]:
    if not values:
        return []
    return [title, *(f"  {key}={values[key]}" for key in sorted(values))]


def _pool_lines(stats: Mapping[str, Any], pool: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    live = [(label, "unknown" if pool is None else _count(pool, key)) for label, key in _POOL_LIVE]
    if pool is not None and int(pool.get("starting") or 0) > 0:
        live.append(("Starting:", _count(pool, "starting")))
    return live + [(label, _count(stats, key)) for label, key in _POOL_COUNTERS]


def _last_lines(stats: Mapping[str, Any], now: float) -> list[tuple[str, str]]:
    """``Last success:  2026-11-29T20:01:02Z (3m ago)`` for each timestamp that is set."""
    lines = []
    for label, key in _STATS_LAST:
        stamp = stats.get(key)
        if not isinstance(stamp, str) or not stamp:
            continue
        at = parse_rfc3339(stamp)
        lines.append((label, stamp if at is None else f"{stamp} ({age(at, now)})"))
    return lines


def _aligned(pairs: Any) -> list[str]:
    pairs = list(pairs)
    width = max(len(label) for label, _ in pairs) + 2
    return [f"  {label:<{width}}{value}" for label, value in pairs]


def _count(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    return str(int(value)) if isinstance(value, int | float) else "0"


def _retries(rule: Mapping[str, Any]) -> str:
    retries = rule.get("retries")
    return "" if retries is None or retries == _DEFAULT_RETRIES else f" retries={retries}"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def age(then: float, now: float) -> str:
    """``12s ago``, ``3m ago``, ``2h ago``, ``5d ago``; a date beyond ~30 days."""
    seconds = max(0, int(now - then))
    if seconds >= _ABSOLUTE_AFTER_S:
        return datetime.fromtimestamp(then, UTC).strftime("%Y-%m-%d")
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _safe_describe(describe: Callable[[str], str | None], cron: str) -> str | None:
    try:
        return describe(cron)
    except Exception:  # noqa: BLE001 - display only: a raw cron beats a failed inspect
        return None


# --- database access ------------------------------------------------------------
def _open() -> StateDatabase | None:
    path = load_paths(os.environ).database
    try:
        return open_db_readonly(path)
    except sqlite3.Error as exc:
        fail(f"cannot read the state database {path}: {exc}")


def _read(db: StateDatabase, query: Callable[[StateDatabase], Any]) -> Any:
    try:
        return query(db)
    except sqlite3.Error as exc:
        fail(f"cannot read the state database {db.path}: {exc}")
