"""``relay function validate`` and ``relay function match``: no Docker or Redis needed.

Both take function directories (a directory holding ``template.yaml``) or a functions
directory (whose direct subdirectories holding ``template.yaml`` are the functions).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from relay.domain.errors import EventError
from relay.domain.patterns import parse_rfc3339
from relay.entrypoints.cli.common import EXIT_FAILURE, fail, out, usage
from relay.entrypoints.cli.event_input import EventOption, FileOption, read_event_argument
from relay.entrypoints.cli.fn_loading import Loaded, PathNotFound, discover, load
from relay.entrypoints.cli.fn_match import (
    DryFlags,
    ExplainOption,
    FromDlqOption,
    FromStreamOption,
    LimitOption,
    SinceOption,
    dry_request,
    run_dry,
)
from relay.entrypoints.cli.fn_validate import Checked, FormatOption, chosen_format, report
from relay.entrypoints.cli.json_output import JsonFlag


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("match")(match)


def validate(
    paths: Annotated[
        list[Path],
        typer.Argument(help="Function directories, or functions directories to validate."),
    ],
    as_json: JsonFlag = False,
    output_format: FormatOption = None,
) -> None:
    """Validate function directories without Docker or Redis (exit 1 if any is invalid)."""
    chosen = chosen_format(as_json, output_format)
    checked: list[Checked] = []
    for path in paths:
        try:
            functions = discover(path)
        except PathNotFound as exc:
            checked.append(Checked(path, str(exc), []))
            continue
        checked.append(Checked(path, None, [load(name, d) for name, d in functions]))
    if report(checked, chosen):
        raise typer.Exit(EXIT_FAILURE)


def match(  # noqa: PLR0917 - a typer command: its options are its parameters
    path: Annotated[Path, typer.Argument(help="A function directory or a functions directory.")],
    event: EventOption = None,
    file: FileOption = None,
    at: Annotated[
        str | None,
        typer.Option("--at", help="Evaluate now() at this RFC3339 instant, not the clock."),
    ] = None,
    from_stream: FromStreamOption = False,
    from_dlq: FromDlqOption = False,
    since: SinceOption = None,
    limit: LimitOption = None,
    explain: ExplainOption = False,
    as_json: JsonFlag = False,
) -> None:
    """Explain which rules match an event, and why the others do not; with --from-stream or
    --from-dlq, count what they match in real traffic (a dry run, nothing consumed)."""
    now = time.time()
    instant: float | None = None
    if at is not None:
        instant = parse_rfc3339(at)
        if instant is None:
            usage(f"--at: {json.dumps(at)} is not an RFC3339 timestamp (e.g. 2026-09-12T10:00:00Z)")
        now = instant
    request = dry_request(
        DryFlags(from_stream, from_dlq, since, limit, explain=explain, as_json=as_json),
        one_event=event is not None or file is not None,
        at=instant,
    )
    try:
        payload = None if request else read_event_argument(event, file, sys.stdin)
        functions = discover(path)
    except (EventError, PathNotFound) as exc:
        fail(str(exc))
    loaded = [load(name, d, check_source=False) for name, d in functions]
    if request is not None:
        run_dry(loaded, request, as_json=as_json)
        return
    assert payload is not None
    for line in explain_matches(loaded, payload, now):
        out(line)


def explain_matches(functions: list[Loaded], event: dict[str, Any], now: float) -> list[str]:
    """One line per rule: ``match  <fn>  <handler>`` or ``no     <fn>  <handler>: <why>``;
    invalid functions are listed as ``skip`` and a summary line ends the output."""
    width = max((len(f.name) for f in functions), default=0)
    lines: list[str] = []
    total = matched = 0
    for loaded in functions:
        name = loaded.name.ljust(width)
        if loaded.template is None:
            lines.append(f"skip   {name}  invalid template (run: relay function validate)")
            continue
        for rule in loaded.template.events:
            total += 1
            reasons = rule.pattern.explain(event, now)
            if reasons:
                lines.append(f"no     {name}  {rule.handler}: {'; '.join(reasons)}")
            else:
                matched += 1
                lines.append(f"match  {name}  {rule.handler}")
    noun = "rule" if total == 1 else "rules"
    lines.append(f"{matched} of {total} event {noun} matched")
    return lines
