"""``relay dlq replay --function F ...``: replay a selection on the live worker, paced.

Each selected entry is sent to the worker as one ``ReplayDeadLetter`` command (the same
one the single-id form sends), one after another, starting replay ``i`` no earlier
than ``i / rate`` seconds after the first. The worker deletes an entry only after
its handler succeeded; an entry whose replay fails again is kept. Entries that
record a malformed message (no handler) or that are already gone are skipped.

Progress goes to stderr: a bar redrawn in place on a terminal, one plain line per
entry otherwise. The summary goes to stdout. Ctrl-C stops before the next entry
and reports what was done; an entry already sent finishes on the worker (and is
deleted only if it succeeded).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import typer

from relay.adapters.control.client import ControlRequestError, WorkerUnavailable, request
from relay.domain.commands import ReplayDeadLetter
from relay.domain.dlq_selection import InvalidSelection, RateLimit, Selection, parse_rate
from relay.entrypoints.cli.brokers import with_dead_letters
from relay.entrypoints.cli.common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, fail, out
from relay.entrypoints.cli.dlq_select import check_function_known, discard_all, select
from relay.entrypoints.config import BrokerSettings, RedisSettings, load_paths

if TYPE_CHECKING:  # a type only
    from relay.domain.dead_letters import StoredDeadLetter

Settings = tuple[BrokerSettings, RedisSettings]

REPLAY_TIMEOUT_S = 360.0
"""Longer than the largest handler timeout (5m) plus a container start."""

GONE_KINDS = frozenset({"DeadLetterNotFound"})
"""Worker error kinds meaning the entry is no longer there (someone else removed it)."""


@dataclass
class ReplayRun:
    """What a bulk replay did, entry by entry."""

    selected: int
    replayed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    interrupted: bool = False
    in_flight: str | None = None
    """The entry whose request was under way when Ctrl-C came (outcome on the worker)."""
    stopped_by: str | None = None
    """Why the run stopped early (the worker went away), or ``None``."""
    elapsed_s: float = 0.0

    @property
    def done(self) -> int:
        return len(self.replayed) + len(self.failed) + len(self.skipped)

    def summary(self) -> str:
        line = (
            f"Replayed {len(self.replayed)}, failed again {len(self.failed)}, "
            f"skipped {len(self.skipped)} of {self.selected} selected in {self.elapsed_s:.1f}s"
        )
        if self.interrupted:
            line += f"; interrupted, {self.selected - self.done} not attempted"
            if self.in_flight:
                line += (
                    f" ({self.in_flight} was in flight: the worker finishes it and"
                    " removes it only if it succeeded)"
                )
        elif self.stopped_by:
            line += f"; stopped, {self.selected - self.done} not attempted: {self.stopped_by}"
        return line


Send = Callable[[str], None]


def worker_sender(socket_path: Path, timeout_s: float) -> Send:
    def send(entry_id: str) -> None:
        request(socket_path, ReplayDeadLetter(entry_id=entry_id), timeout=timeout_s)

    return send


class Progress:
    """A bar on a terminal, plain lines otherwise; both on ``stream`` (stderr)."""

    def __init__(self, stream: TextIO, total: int) -> None:
        self._stream = stream
        self._total = total
        self._tty = stream.isatty()

    def step(self, run: ReplayRun, entry: StoredDeadLetter, outcome: str) -> None:
        if self._tty:
            width = 30
            filled = width * run.done // max(1, self._total)
            bar = "#" * filled + "-" * (width - filled)
            self._stream.write(
                f"\r[{bar}] {run.done}/{self._total}  replayed {len(run.replayed)}"
                f"  failed {len(run.failed)}  skipped {len(run.skipped)}"
            )
        else:
            e = entry.entry
            self._stream.write(
                f"[{run.done}/{self._total}] {outcome} {entry.id} ({e.function}/{e.handler})\n"
            )
        self._stream.flush()

    def close(self) -> None:
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()


def replay_all(
    entries: list[StoredDeadLetter],
    *,
    rate: RateLimit,
    send: Send,
    progress: Progress,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ReplayRun:
    """Replay ``entries`` in order at ``rate``; Ctrl-C ends the run, never raises."""
    run = ReplayRun(selected=len(entries))
    started = clock()
    try:
        sent = 0  # pacing counts requests: a skipped entry costs no slot
        for stored in entries:
            if not stored.replayable:
                run.skipped.append(stored.id)
                progress.step(run, stored, "skipped (malformed message, no handler)")
                continue
            sleep(rate.wait_s(sent, clock() - started))
            sent += 1
            run.in_flight = stored.id
            outcome = _one(run, stored, send)
            run.in_flight = None
            if run.stopped_by:
                break
            progress.step(run, stored, outcome)
    except KeyboardInterrupt:
        run.interrupted = True
    finally:
        run.elapsed_s = clock() - started
        progress.close()
    return run


def _one(run: ReplayRun, stored: StoredDeadLetter, send: Send) -> str:
    try:
        send(stored.id)
    except WorkerUnavailable as exc:
        run.stopped_by = f"{exc}; entries not replayed are kept"
        return "stopped"
    except ControlRequestError as exc:
        if exc.kind in GONE_KINDS:
            run.skipped.append(stored.id)
            return "skipped (already removed)"
        run.failed.append(stored.id)
        return f"failed again, kept: {exc}"
    run.replayed.append(stored.id)
    return "replayed"


def stderr_progress(total: int) -> Progress:
    return Progress(sys.stderr, total)


def replay_selection(
    chosen: Selection, rate_text: str, *, dry_run: bool, load: Callable[[], Settings]
) -> None:
    """The ``relay dlq replay --function F ...`` command, after its flags parsed."""
    if chosen.function is None:
        fail("a bulk replay needs --function (or give one entry id)", EXIT_USAGE)
    try:
        pace = parse_rate(rate_text)
    except InvalidSelection as exc:
        fail(str(exc), EXIT_USAGE)
    settings = load()  # after the flags: a usage error never waits on the environment
    found = with_dead_letters(settings, lambda r: select(r, chosen, newest_first=False))
    check_function_known(chosen, found)
    entries = found.entries
    if dry_run:
        for stored in entries:
            e, what = stored.entry, "would replay" if stored.replayable else "would skip"
            out(f"{what} {stored.id} ({e.function}/{e.handler})")
        replayable = sum(stored.replayable for stored in entries)
        out(
            f"Dry run: {replayable} would be replayed, {len(entries) - replayable} skipped, "
            f"at {pace.per_s:g}/s (at least {pace.start_offset_s(max(0, replayable - 1)):.1f}s);"
            " nothing was sent or removed"
        )
        return
    if not entries:
        out(f"No dead-lettered entries match ({chosen.describe()}); nothing replayed")
        return
    socket = load_paths(os.environ).socket
    run = replay_all(
        entries,
        rate=pace,
        send=worker_sender(socket, REPLAY_TIMEOUT_S),
        progress=stderr_progress(len(entries)),
    )
    if run.replayed:  # as the single-id form: gone for certain once the worker said success
        replayed = run.replayed
        with_dead_letters(settings, lambda reader: discard_all(reader, replayed))
    out(run.summary())
    if run.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    if run.failed or run.stopped_by:
        raise typer.Exit(EXIT_FAILURE)
