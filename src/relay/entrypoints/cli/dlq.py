"""``relay dlq ...``: the dead-letter stream ``relay:<stream>:dlq``.

``ls`` lists newest first (the failure you are chasing is usually the latest;
``--oldest-first`` reverses it);
``inspect`` shows one entry and its original event; ``rm`` deletes exactly one
entry; ``replay`` re-runs the entry's recorded handler on the running worker and
the entry is deleted only once that handler succeeded.

Settings come from the environment: ``REDIS_URI`` and ``REDIS_STREAM`` (and
``REDIS_GROUP`` for ``replay``), read by :mod:`relay.entrypoints.config`; with
``RELAY_BROKER=sqlite`` the embedded broker's ``dlq`` table instead (same output).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

import typer

from relay.adapters.control.client import ControlRequestError, WorkerUnavailable, request
from relay.adapters.redis.dlq_reader import StoredDeadLetter
from relay.entrypoints.cli.brokers import DeadLetters, broker_settings, with_dead_letters
from relay.entrypoints.cli.common import fail, out
from relay.entrypoints.config import BrokerSettings, RedisSettings, load_paths

T = TypeVar("T")

REPLAY_TIMEOUT_S = 360.0
"""Longer than the largest handler timeout (5m) plus a container start."""

app = typer.Typer(
    help="List, inspect, replay and remove dead-lettered entries.", no_args_is_help=True
)


Settings = tuple[BrokerSettings, RedisSettings]


def _settings(*, need_group: bool = False) -> Settings:
    return broker_settings(need_group=need_group)


def _with_reader(settings: Settings, action: Callable[[DeadLetters], Awaitable[T]]) -> T:
    return with_dead_letters(settings, action)


@app.command("ls")
def ls(
    limit: int = typer.Option(100, help="Show at most this many entries; 0 shows all."),
    oldest_first: bool = typer.Option(False, "--oldest-first", help="List oldest first."),
) -> None:
    """List dead-lettered entries, newest first."""

    async def collect(reader: DeadLetters) -> tuple[list[StoredDeadLetter], int]:
        rows: list[StoredDeadLetter] = []
        async for entry in reader.entries(newest_first=not oldest_first):
            rows.append(entry)
            if limit and len(rows) >= limit:
                break
        return rows, await reader.count()

    rows, total = _with_reader(_settings(), collect)
    if not rows:
        out("No dead-lettered entries")
        return
    now = datetime.now(UTC).timestamp()
    table = [["ID", "ORIGINAL", "FUNCTION", "HANDLER", "ATTEMPTS", "AGE"]]
    for stored in rows:
        e, age = stored.entry, relative_age(now - _written_at(stored))
        table.append(
            [stored.id, e.original_id, e.function, e.handler, str(e.handler_attempts), age]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        out("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    if total > len(rows):
        out(f"({len(rows)} of {total} entries shown; use --limit 0 for all)")


@app.command("inspect")
def inspect_(entry_id: str) -> None:
    """Show one entry's metadata and original event."""
    entry = _with_reader(_settings(), lambda reader: reader.get(entry_id))
    for line in describe(entry, now=datetime.now(UTC).timestamp()):
        out(line)


@app.command("rm")
def rm(entry_id: str) -> None:
    """Delete exactly one dead-lettered entry."""
    entry = _with_reader(_settings(), lambda reader: _delete(reader, entry_id))
    out(f"Removed {entry.id}")


async def _delete(reader: DeadLetters, entry_id: str) -> StoredDeadLetter:
    entry = await reader.get(entry_id)
    await reader.delete(entry.id)
    return entry


@app.command("replay")
def replay(entry_id: str) -> None:
    """Re-run one entry's exact handler on the running worker; delete it on success."""
    settings = _settings(need_group=True)
    entry = _with_reader(settings, lambda reader: reader.get(entry_id))
    if not entry.replayable:
        fail(
            f"entry {entry.id} records a malformed message, not a handler failure: "
            f"there is no handler to replay (remove it with 'relay dlq rm {entry.id}')"
        )
    socket_path = load_paths(os.environ).socket
    try:
        request(socket_path, "dlq_replay", entry_id=entry.id, timeout=REPLAY_TIMEOUT_S)
    except WorkerUnavailable as exc:
        fail(f"replay needs a running worker ('relay start'); {exc}; the entry is kept")
    except ControlRequestError as exc:
        fail(f"replay of {entry.id} failed: {exc}; the entry is kept")
    # The worker deletes the entry after the handler succeeded; make sure it is gone
    # even if the worker could not (it answered success, so deleting is now correct).
    _with_reader(settings, lambda reader: reader.discard(entry.id))
    out(f"Replayed {entry.id} ({entry.entry.function}/{entry.entry.handler}); entry removed")


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
