"""The selection flags of ``relay dlq ls|rm|replay`` and the one walk that applies them.

The flags are parsed into :class:`relay.domain.dlq_selection.Selection` here (a bad
value is one line and exit 2, before any broker is touched) and :func:`select`
reads the dead letters once, in the chosen order, keeping what the selection
matches. ``--function`` must name a function the worker has loaded (the state
database) or one some entry records; anything else is a typo and exit 2.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

import typer

from relay.adapters.sqlite.db import open_db_readonly
from relay.domain.dlq_selection import InvalidSelection, Selection, parse_limit, parse_time_bound
from relay.entrypoints.cli.common import EXIT_USAGE, fail
from relay.entrypoints.config import load_paths

if TYPE_CHECKING:
    from relay.application.ports import DeadLetterStore
    from relay.domain.dead_letters import StoredDeadLetter

FunctionOpt = Annotated[
    str | None, typer.Option("--function", help="Only entries of this function.")
]
HandlerOpt = Annotated[str | None, typer.Option("--handler", help="Only entries of this handler.")]
SinceOpt = Annotated[
    str | None,
    typer.Option(
        "--since", help="Only entries written since then: a duration back (1h) or RFC 3339."
    ),
]
UntilOpt = Annotated[
    str | None,
    typer.Option("--until", help="Only entries written until then (inclusive); same forms."),
]
ReasonOpt = Annotated[
    str | None,
    typer.Option("--reason", help="Only entries whose reason contains this text (any case)."),
]
LimitOpt = Annotated[
    str | None, typer.Option("--limit", help="At most this many entries (oldest first).")
]


@dataclass
class Selected:
    """What one walk found: the chosen entries and what the operator needs around them."""

    entries: list[StoredDeadLetter] = field(default_factory=list)
    matched: int = 0
    """Entries the selection matched before ``limit`` cut the list."""
    total: int = 0
    functions: set[str] = field(default_factory=set)


def selection(
    *,
    function: str | None = None,
    handler: str | None = None,
    since: str | None = None,
    until: str | None = None,
    before: str | None = None,
    reason: str | None = None,
    limit: str | None = None,
    zero_limit_is_all: bool = False,
) -> Selection:
    """The flags as one :class:`Selection`, or one line and exit 2."""
    for flag, text in (("--function", function), ("--handler", handler)):
        if text is not None and not text.strip():
            fail(f"{flag} must not be empty", EXIT_USAGE)
    try:
        since_ms, until_ms = _window(since, until, before, now_ms=int(time.time() * 1000))
        count = parse_limit(limit, zero_means_all=zero_limit_is_all) if limit is not None else None
    except InvalidSelection as exc:
        fail(str(exc), EXIT_USAGE)
    return Selection(
        function=function,
        handler=handler,
        since_ms=since_ms,
        until_ms=until_ms,
        reason=reason or None,
        limit=count,
    )


def _window(
    since: str | None, until: str | None, before: str | None, *, now_ms: int
) -> tuple[int | None, int | None]:
    if until is not None and before is not None:
        raise InvalidSelection("--until and --before cannot be combined: pick one")
    until_ms = parse_time_bound("--until", until, now_ms=now_ms) if until is not None else None
    if before is not None:
        until_ms = parse_time_bound("--before", before, now_ms=now_ms) - 1
    since_ms = parse_time_bound("--since", since, now_ms=now_ms) if since is not None else None
    if since_ms is not None and until_ms is not None and since_ms > until_ms:
        raise InvalidSelection("--since is later than --until/--before: nothing can match")
    return since_ms, until_ms


async def select(reader: DeadLetterStore, chosen: Selection, *, newest_first: bool) -> Selected:
    """One walk over every entry, keeping the matches (up to ``chosen.limit``)."""
    found = Selected(total=await reader.count())
    async for stored in reader.entries(newest_first=newest_first):
        e = stored.entry
        found.functions.add(e.function)
        if not chosen.matches(
            function=e.function, handler=e.handler, reason=e.reason, written_ms=stored.created_ms
        ):
            continue
        found.matched += 1
        if chosen.limit is None or len(found.entries) < chosen.limit:
            found.entries.append(stored)
    return found


def check_function_known(chosen: Selection, found: Selected) -> None:
    """Exit 2 when ``--function`` names neither a loaded function nor any entry's."""
    name = chosen.function
    if name is None or name in found.functions or name in _loaded_functions():
        return
    fail(
        f'unknown function "{name}": no loaded function and no dead-letter entry has that name'
        " (see 'relay function ls')",
        EXIT_USAGE,
    )


def _loaded_functions() -> set[str]:
    path = load_paths(os.environ).database
    try:
        db = open_db_readonly(path)
        if db is None:
            return set()
        try:
            return {key for key, _data, _at in db.rows("functions")}
        finally:
            db.close()
    except sqlite3.Error:
        return set()  # an unreadable state database only loses the typo check


async def discard_all(reader: DeadLetterStore, ids: list[str]) -> int:
    """Delete each entry still there; how many this call removed."""
    removed = 0
    for entry_id in ids:
        removed += await reader.discard(entry_id)
    return removed
