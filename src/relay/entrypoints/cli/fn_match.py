"""``relay function match DIR --from-stream | --from-dlq``: a dry run over real traffic.

Reads the newest entries of the configured stream (``XREVRANGE`` on Redis, a plain
``SELECT`` of the embedded broker's jobs), or the original events of the dead-letter
entries, and counts what the rules in DIR would match, through the dispatcher's own
classification (:mod:`relay.application.dry_run`). Nothing is consumed, claimed or
acknowledged. See docs/templates.md ("Checking a pattern change against real traffic").
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import msgspec
import typer

from relay.application.dry_run import (
    DryRun,
    DryRunReport,
    RuleCount,
    SampledEntry,
    StreamNotFound,
    dry_run_catalog,
)
from relay.application.ports import DeadLetterStore, StreamSample
from relay.domain.durations import DurationError, parse_setting_duration
from relay.domain.errors import RelayError
from relay.domain.outcome import rfc3339
from relay.entrypoints.cli.brokers import broker_settings
from relay.entrypoints.cli.common import EXIT_FAILURE, EXIT_USAGE, fail, out
from relay.entrypoints.cli.json_output import emit_json
from relay.entrypoints.config import load_max_event_bytes

if TYPE_CHECKING:
    from relay.entrypoints.cli.fn_loading import Loaded


DRY_RUN_LIMIT = 1000
"""Events a dry run reads when no ``--limit`` is given (the newest ones)."""

FromStreamOption = Annotated[
    bool,
    typer.Option(
        "--from-stream",
        help="Dry run: count what the rules match in the newest entries of the stream "
        "(read only; nothing is consumed or acknowledged).",
    ),
]
FromDlqOption = Annotated[
    bool,
    typer.Option("--from-dlq", help="Dry run over the original events of the dead letters."),
]
SinceOption = Annotated[
    str | None,
    typer.Option("--since", help="Dry run: only entries this recent (a duration: 1h, 30m)."),
]
LimitOption = Annotated[
    int | None,
    typer.Option(
        "--limit",
        help=f"Dry run: read at most this many events (default {DRY_RUN_LIMIT}, newest first).",
    ),
]
ExplainOption = Annotated[
    bool,
    typer.Option(
        "--explain", help="Dry run: for a few non-matching events per rule, which condition failed."
    ),
]


class DryFlags(msgspec.Struct, frozen=True):
    """The dry-run options as given on the command line."""

    from_stream: bool
    from_dlq: bool
    since: str | None
    limit: int | None
    explain: bool = False
    as_json: bool = False


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """What to read and how to evaluate it (already validated)."""

    source: str  # "stream" or "dlq"
    since_ms: int | None  # how far back, in ms (None: no cut-off)
    limit: int
    at: float | None  # evaluate now() here instead of at each entry's time
    explain: bool


def dry_request(flags: DryFlags, *, one_event: bool, at: float | None) -> Request | None:
    """The dry run asked for, ``None`` for the single-event mode; a misuse of the
    options is one line and exit 2."""
    if flags.from_stream and flags.from_dlq:
        fail("--from-stream and --from-dlq cannot be combined: choose one source", EXIT_USAGE)
    if not (flags.from_stream or flags.from_dlq):
        given = {
            "--since": flags.since is not None,
            "--limit": flags.limit is not None,
            "--explain": flags.explain,
            "--json": flags.as_json,
        }
        misused = [name for name, on in given.items() if on]
        if misused:
            fail(f"{misused[0]} needs --from-stream or --from-dlq", EXIT_USAGE)
        return None
    if one_event:
        fail(
            "--event and --file give one event to match: they cannot be combined with "
            "--from-stream or --from-dlq",
            EXIT_USAGE,
        )
    if flags.limit is not None and flags.limit <= 0:
        fail(f"--limit: must be a positive number of events (got {flags.limit})", EXIT_USAGE)
    return Request(
        source="dlq" if flags.from_dlq else "stream",
        since_ms=None if flags.since is None else parse_since(flags.since),
        limit=DRY_RUN_LIMIT if flags.limit is None else flags.limit,
        at=at,
        explain=flags.explain,
    )


def parse_since(text: str) -> int:
    """``--since`` in ms, or one line and exit 2."""
    try:
        ns = parse_setting_duration(text)
    except DurationError:
        ns = 0
    if ns <= 0:
        fail(f"--since: {text!r} is not a positive duration (examples: 30m, 1h, 7d)", EXIT_USAGE)
    return -(-ns // 1_000_000)  # at least 1 ms: a positive duration stays positive


def run_dry(loaded: list[Loaded], request: Request, *, as_json: bool) -> None:
    """Read, count, print; exit 1 when a template could not be loaded."""
    valid = {f.name: f.template for f in loaded if f.template is not None}
    invalid = [f for f in loaded if f.template is None]
    catalog = dry_run_catalog(valid, (f.name for f in invalid))
    try:
        limit = load_max_event_bytes(os.environ)
    except RelayError as exc:
        fail(str(exc))
    counter = DryRun(catalog, max_event_bytes=limit, at=request.at, explain=request.explain)
    broker, redis_settings = broker_settings(need_group=False)
    stream = redis_settings.stream

    async def read_all(sample: StreamSample, dead: DeadLetterStore | None) -> None:
        try:
            await sample.check()
        except StreamNotFound:
            # dead letters outlive a deleted stream: only a name naming neither is wrong
            if dead is None or not await dead.count():
                raise
        since = None
        if request.since_ms is not None:
            since = max(0, await sample.server_ms() - request.since_ms)
        entries = (
            sample.newest(since_ms=since, limit=request.limit)
            if dead is None
            else dead_letter_events(dead, since_ms=since, limit=request.limit)
        )
        async for entry in entries:
            counter.add(entry)

    # the broker's readers are imported when it is opened: `function validate` and a
    # match against one event (this module's neighbours) need neither
    async def run() -> None:
        from relay.adapters.admin import open_admin_broker

        async with open_admin_broker(broker, redis_settings) as admin:
            dead = admin.dead_letters if request.source == "dlq" else None
            await read_all(admin.sample, dead)

    try:
        anyio.run(run)
    except RelayError as exc:
        fail("; ".join(str(exc).splitlines()))
    report = counter.report()
    where = {"broker": broker.kind, "stream": stream}
    if as_json:
        emit_json("function.match", document(report, request, where, invalid))
    else:
        for line in text_lines(report, request, where, invalid):
            out(line)
    if invalid:
        raise typer.Exit(EXIT_FAILURE)


async def dead_letter_events(
    reader: DeadLetterStore, *, since_ms: int | None, limit: int
) -> AsyncIterator[SampledEntry]:
    """The original events of the dead-letter entries, newest entry first, each
    original message once (one entry per exhausted handler shares its event)."""
    from relay.adapters.redis.stream_sample import entry_time

    seen: set[str] = set()
    async for stored in reader.entries(newest_first=True):
        if since_ms is not None and stored.created_ms < since_ms:
            return
        entry = stored.entry
        if entry.original_id in seen:
            continue
        seen.add(entry.original_id)
        try:
            at = entry_time(entry.original_id)
        except ValueError:
            at = stored.created_ms / 1000
        yield SampledEntry(
            id=stored.id,
            payload=entry.event.encode("utf-8"),
            at=at,
            recorded=None if stored.replayable else entry.reason,
        )
        if len(seen) >= limit:
            return


def _evaluated_at(request: Request) -> str:
    return "entry" if request.at is None else rfc3339(request.at)


def document(
    report: DryRunReport, request: Request, where: dict[str, str], invalid: list[Loaded]
) -> dict[str, Any]:
    """The ``relay.function.match/1`` body (docs/schemas/function.match.v1.json)."""
    return {
        "source": request.source,
        **where,
        "since_ms": request.since_ms,
        "limit": request.limit,
        "limit_reached": report.entries >= request.limit,
        "now": _evaluated_at(request),
        "entries": report.entries,
        "newest_id": report.newest_id,
        "oldest_id": report.oldest_id,
        "matched": report.matched,
        "unmatched": report.unmatched,
        "malformed": report.malformed,
        "occurrences": report.occurrences,
        "rules": [_rule_document(r, explain=request.explain) for r in report.rules],
        "malformed_samples": [{"id": m.id, "reason": m.reason} for m in report.malformed_samples],
        "invalid": [{"function": f.name, "problems": list(f.problems)} for f in invalid],
    }


def _rule_document(rule: RuleCount, *, explain: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "function": rule.function,
        "handler": rule.handler,
        "rule": rule.rule,
        "matched": rule.matched,
        # every field is always there (docs/cli.md): null without --explain
        "non_matches": [{"id": n.id, "reasons": list(n.reasons)} for n in rule.non_matches]
        if explain
        else None,
    }
    return body


def text_lines(
    report: DryRunReport, request: Request, where: dict[str, str], invalid: list[Loaded]
) -> list[str]:
    source = "dead letters of" if request.source == "dlq" else "stream"
    noun = "entry" if report.entries == 1 else "entries"
    span = f" ({report.newest_id} back to {report.oldest_id})" if report.entries else ""
    when = (
        "now() at each entry's own time"
        if request.at is None
        else f"now() at {_evaluated_at(request)}"
    )
    lines = [
        f"dry run: {report.entries} {noun} of {source} {where['stream']!r} on {where['broker']}"
        f"{span}, {when}; nothing consumed or acknowledged"
    ]
    if report.entries >= request.limit:
        lines.append(f"(--limit {request.limit} reached: older entries were not read)")
    names = [r.function for r in report.rules] + [f.name for f in invalid]
    width = max((len(n) for n in names), default=0)
    counts = [str(r.matched) for r in report.rules]
    digits = max((len(c) for c in counts), default=1)
    for r, count in zip(report.rules, counts, strict=True):
        lines.append(f"{count.rjust(digits)}  {r.function.ljust(width)}  {r.handler}")
        for n in r.non_matches:
            lines.append(f"{' ' * digits}    no {n.id}: {'; '.join(n.reasons)}")
    for f in invalid:
        more = f" (+{len(f.problems) - 1} more)" if len(f.problems) > 1 else ""
        lines.append(
            f"{'-'.rjust(digits)}  {f.name.ljust(width)}  invalid template, not evaluated: "
            f"{f.problems[0]}{more} (run: relay function validate)"
        )
    lines.append(
        f"{report.matched} matched, {report.unmatched} unmatched, {report.malformed} malformed"
        f" (the worker would dead-letter them), {report.occurrences} schedule occurrences"
    )
    for m in report.malformed_samples:
        lines.append(f"malformed {m.id}: {m.reason}")
    if invalid:
        lines.append(
            "a worker with these templates runs the valid ones but keeps every message pending"
            " until the invalid ones are fixed or removed"
        )
    return lines
