"""``relay dlq ...``: the dead-letter stream ``relay:<stream>:dlq``.

``ls`` lists newest first (the failure you are chasing is usually the latest;
``--oldest-first`` reverses it);
``inspect`` shows one entry and its original event; ``rm`` deletes exactly one
entry; ``replay`` re-runs the entry's recorded handler on the running worker and
the entry is deleted only once that handler succeeded (a malformed message's
entry names no handler: its kept payload is published again, see
:mod:`relay.entrypoints.cli.dlq_republish`). ``ls``, ``rm`` and ``replay`` also
take the selection flags (:mod:`relay.entrypoints.cli.dlq_select`): bulk ``rm``
asks before deleting unless ``--yes``; bulk ``replay`` needs
``--function`` and is paced by ``--rate`` (:mod:`relay.entrypoints.cli.dlq_bulk_replay`).
``ls --json`` and ``inspect --json`` print ``relay.dlq.ls/1`` / ``relay.dlq.inspect/1``.

Settings come from the environment: ``REDIS_URI`` and ``REDIS_STREAM`` (and
``REDIS_GROUP`` for ``replay``), read by :mod:`relay.entrypoints.config`; with
``RELAY_BROKER=sqlite`` the embedded broker's ``dlq`` table instead (same output).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from relay.adapters.control.client import ControlRequestError, WorkerUnavailable, request
from relay.domain.commands import ReplayDeadLetter
from relay.domain.dlq_selection import DEFAULT_RATE
from relay.entrypoints.cli.brokers import broker_settings, require_stream, with_dead_letters
from relay.entrypoints.cli.common import EXIT_USAGE, fail, out
from relay.entrypoints.cli.dlq_bulk_replay import REPLAY_TIMEOUT_S, replay_selection
from relay.entrypoints.cli.dlq_republish import republish_malformed
from relay.entrypoints.cli.dlq_select import (
    FunctionOpt,
    HandlerOpt,
    LimitOpt,
    ReasonOpt,
    Selected,
    SinceOpt,
    UntilOpt,
    check_function_known,
    discard_all,
    select,
    selection,
)
from relay.entrypoints.cli.json_output import JsonFlag, emit_json
from relay.entrypoints.config import BrokerSettings, RedisSettings, load_paths

if TYPE_CHECKING:
    from relay.application.ports import DeadLetterStore
    from relay.domain.dead_letters import StoredDeadLetter

T = TypeVar("T")

app = typer.Typer(
    help="List, inspect, replay and remove dead-lettered entries.", no_args_is_help=True
)


Settings = tuple[BrokerSettings, RedisSettings]


def _settings(*, need_group: bool = False) -> Settings:
    return broker_settings(need_group=need_group)


def _with_reader(settings: Settings, action: Callable[[DeadLetterStore], Awaitable[T]]) -> T:
    return with_dead_letters(settings, action)


@app.command("ls")
def ls(
    *,
    function: FunctionOpt = None,
    handler: HandlerOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    reason: ReasonOpt = None,
    limit: str = typer.Option("100", help="Show at most this many entries; 0 shows all."),
    oldest_first: bool = typer.Option(False, "--oldest-first", help="List oldest first."),
    as_json: JsonFlag = False,
) -> None:
    """List dead-lettered entries, newest first."""
    chosen = selection(
        function=function,
        handler=handler,
        since=since,
        until=until,
        reason=reason,
        limit=limit,
        zero_limit_is_all=True,
    )
    settings = _settings()
    found = _with_reader(settings, lambda r: select(r, chosen, newest_first=not oldest_first))
    if found.total == 0:
        # An empty DLQ of a stream that does not exist is a wrong REDIS_STREAM, not
        # an answer (a DLQ that holds entries is listed even after its stream went).
        require_stream(settings)
    check_function_known(chosen, found)
    now = datetime.now(UTC).timestamp()
    if as_json:
        emit_json(
            "dlq.ls",
            {
                "total": found.total,
                "matched": found.matched,
                "entries": [entry_json(stored, now=now) for stored in found.entries],
            },
        )
        return
    _print_table(found, now=now)


def _print_table(found: Selected, *, now: float) -> None:
    rows = found.entries
    if not rows:
        out("No dead-lettered entries" + (" match the selection" if found.total else ""))
        return
    table = [["ID", "ORIGINAL", "FUNCTION", "HANDLER", "ATTEMPTS", "AGE"]]
    for stored in rows:
        e, age = stored.entry, relative_age(now - _written_at(stored))
        table.append(
            [stored.id, e.original_id, e.function, e.handler, str(e.handler_attempts), age]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        out("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    if found.matched > len(rows):
        out(f"({len(rows)} of {found.matched} entries shown; use --limit 0 for all)")
    elif found.total > found.matched:
        out(f"({len(rows)} of {found.total} entries selected)")


@app.command("inspect")
def inspect_(entry_id: str, as_json: JsonFlag = False) -> None:
    """Show one entry's metadata and original event."""
    entry = _with_reader(_settings(), lambda reader: reader.get(entry_id))
    now = datetime.now(UTC).timestamp()
    if as_json:
        body = entry_json(entry, now=now)
        body["event"] = entry.entry.event
        body["event_json"] = _event_object(entry.entry.event)
        emit_json("dlq.inspect", body)
        return
    for line in describe(entry, now=now):
        out(line)


@app.command("rm")
def rm(
    entry_id: str | None = typer.Argument(None, help="One entry's id (as 'relay dlq ls' shows)."),
    *,
    function: FunctionOpt = None,
    handler: HandlerOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    before: str | None = typer.Option(
        None, "--before", help="Only entries written before then: a duration back (7d) or RFC 3339."
    ),
    reason: ReasonOpt = None,
    limit: LimitOpt = None,
    yes: bool = typer.Option(False, "--yes", "-y", help="Remove without asking."),
) -> None:
    """Delete one entry by id, or every entry the selection flags choose (asks first)."""
    flags = (function, handler, since, until, before, reason, limit)
    if entry_id is not None:
        if any(flag is not None for flag in flags):
            fail("give an entry id or selection flags, not both", EXIT_USAGE)
        entry = _with_reader(_settings(), lambda reader: _delete(reader, entry_id))
        out(f"Removed {entry.id}")
        return
    chosen = selection(
        function=function,
        handler=handler,
        since=since,
        until=until,
        before=before,
        reason=reason,
        limit=limit,
    )
    if not chosen.narrows:
        fail("name an entry id, or select entries (--function, --before, ...)", EXIT_USAGE)
    settings = _settings()
    found = _with_reader(settings, lambda r: select(r, chosen, newest_first=False))
    check_function_known(chosen, found)
    if not found.entries:
        out(f"No dead-lettered entries match ({chosen.describe()}); nothing removed")
        return
    count = len(found.entries)
    if not yes and not _confirm(f"Remove {count} dead-lettered entries ({chosen.describe()})?"):
        fail("nothing removed (answer y to remove, or pass --yes)")
    ids = [stored.id for stored in found.entries]
    removed = _with_reader(settings, lambda reader: discard_all(reader, ids))
    gone = count - removed
    suffix = f" ({gone} were already gone)" if gone else ""
    out(f"Removed {removed} entries{suffix}")


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():  # piped: one line answers; a closed stdin is "no"
        typer.echo(f"{question} [y/N]: ", err=True, nl=False)
        return sys.stdin.readline().strip().lower() in {"y", "yes"}
    return typer.confirm(question, default=False, err=True)


async def _delete(reader: DeadLetterStore, entry_id: str) -> StoredDeadLetter:
    entry = await reader.get(entry_id)
    await reader.delete(entry.id)
    return entry


@app.command("replay")
def replay(
    entry_id: str | None = typer.Argument(None, help="One entry's id (as 'relay dlq ls' shows)."),
    *,
    function: FunctionOpt = None,
    handler: HandlerOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    reason: ReasonOpt = None,
    limit: LimitOpt = None,
    rate: str = typer.Option(
        DEFAULT_RATE, "--rate", help="At most this many replays: 5/s, 120/m, 1000/h."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Show what would be replayed; send nothing."
    ),
) -> None:
    """Re-run one entry's (or a selection's) exact handler on the running worker;
    each entry is deleted only after its replay succeeded. A malformed message's
    entry is published to the stream again, byte for byte."""
    flags = (function, handler, since, until, reason, limit)
    if entry_id is None:
        replay_selection(
            selection(
                function=function,
                handler=handler,
                since=since,
                until=until,
                reason=reason,
                limit=limit,
            ),
            rate,
            dry_run=dry_run,
            load=lambda: _settings(need_group=True),
        )
        return
    if any(flag is not None for flag in flags) or dry_run:
        fail("give an entry id or selection flags (--function ...), not both", EXIT_USAGE)
    _replay_one(entry_id)


def _replay_one(entry_id: str) -> None:
    settings = _settings(need_group=True)
    entry = _with_reader(settings, lambda reader: reader.get(entry_id))
    if not entry.replayable:
        republish_malformed(settings, entry)
        return
    socket_path = load_paths(os.environ).socket
    try:
        request(socket_path, ReplayDeadLetter(entry_id=entry.id), timeout=REPLAY_TIMEOUT_S)
    except WorkerUnavailable as exc:
        fail(f"replay needs a running worker ('relay start'); {exc}; the entry is kept")
    except ControlRequestError as exc:
        fail(f"replay of {entry.id} failed: {exc}; the entry is kept")
    # The worker deletes the entry after the handler succeeded; make sure it is gone
    # even if the worker could not (it answered success, so deleting is now correct).
    _with_reader(settings, lambda reader: reader.discard(entry.id))
    out(f"Replayed {entry.id} ({entry.entry.function}/{entry.entry.handler}); entry removed")


def entry_json(stored: StoredDeadLetter, *, now: float) -> dict[str, Any]:
    """One entry's fields for ``--json`` (``ls`` and ``inspect``; see docs/schemas)."""
    e, written = stored.entry, _written_at(stored)
    return {
        "id": stored.id,
        "original_stream": e.original_stream,
        "original_id": e.original_id,
        "group": e.group,
        "consumer": e.consumer,
        "function": e.function,
        "handler": e.handler,
        "handler_attempts": e.handler_attempts,
        "deliveries": e.deliveries,
        "reason": e.reason,
        "timestamp": e.timestamp,
        "written_at": datetime.fromtimestamp(written, UTC).isoformat().replace("+00:00", "Z"),
        "age_s": round(max(0.0, now - written), 3),
        "replayable": stored.replayable,
    }


def _event_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def describe(stored: StoredDeadLetter, *, now: float) -> list[str]:
    """The ``inspect`` text: metadata lines, then the original event."""
    entry, written = stored.entry, _written_at(stored)
    stamp = entry.timestamp or datetime.fromtimestamp(written, UTC).isoformat()
    lines = [
        f"ID:                {stored.id}",
        f"Original stream:   {entry.original_stream}",
        f"Original ID:       {entry.original_id}",
        f"Group:             {entry.group}",
        f"Consumer:          {entry.consumer}",
        f"Function:          {entry.function}",
        f"Handler:           {entry.handler}",
        f"Handler attempts:  {entry.handler_attempts}",
        f"Deliveries:        {entry.deliveries}",
        f"Reason:            {entry.reason}",
        f"Dead-lettered:     {stamp} ({relative_age(now - written)})",
    ]
    pretty = _pretty_event(entry.event)
    if pretty is None:
        lines += ["Event (not a JSON object; shown verbatim):", entry.event]
    else:
        lines += ["Event:", pretty]
    return lines


def _pretty_event(text: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, indent=2, ensure_ascii=False)


def _written_at(stored: StoredDeadLetter) -> float:
    """Seconds since the epoch: the entry's ``timestamp``, else its id's milliseconds."""
    try:
        return datetime.fromisoformat(stored.entry.timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return stored.created_ms / 1000


def relative_age(seconds: float) -> str:
    """``12s ago``, ``3m ago``, ``2h ago``, ``5d ago``; a date beyond about 30 days."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            if unit == "d" and seconds >= 30 * 86400:
                then = datetime.now(UTC).timestamp() - seconds
                return datetime.fromtimestamp(then, UTC).strftime("%Y-%m-%d")
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"
