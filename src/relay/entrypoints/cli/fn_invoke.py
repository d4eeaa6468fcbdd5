"""``relay function invoke``: run matching handlers on the live worker.

The event comes from ``--event``, ``--file`` or piped stdin (a JSON object). The
worker runs the function's matching event rules through its live runtime and
answers over the control socket; nothing touches the stream, the DLQ or the
event counters. There is no offline fallback: without a worker it fails (``relay
function run`` runs one handler without one). Each handler's run is printed as
``relay function run`` prints it (output, return value or error, duration, image),
then the summary line.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

from relay.adapters.control.client import WorkerUnavailable, request
from relay.domain.commands import InvokeFunction
from relay.domain.errors import EventError, RelayError
from relay.entrypoints.cli.common import EXIT_USAGE, fail, out
from relay.entrypoints.cli.event_input import EventOption, FileOption, read_event_argument
from relay.entrypoints.cli.fn_run_report import print_report, report_json
from relay.entrypoints.cli.json_output import JsonFlag, emit_json
from relay.entrypoints.config import load_paths

INVOKE_TIMEOUT_S = 3600.0
"""The worker bounds each handler by its (capped) timeout; this only guards a hung socket."""


def register(app: typer.Typer) -> None:
    app.command("invoke")(invoke)


def invoke(
    name: Annotated[str, typer.Argument(help="Function name.")],
    event: EventOption = None,
    file: FileOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Run a function's matching handlers on the live worker."""
    try:
        payload = read_event_argument(event, file, sys.stdin)
    except EventError as exc:
        fail(str(exc), EXIT_USAGE)
    socket = load_paths(os.environ).socket
    try:
        result = request(
            socket, InvokeFunction(function=name, event=payload), timeout=INVOKE_TIMEOUT_S
        )
    except WorkerUnavailable as exc:
        fail(f"{exc}; `relay function invoke` needs a running worker (`relay start`)")
    except RelayError as exc:
        fail(str(exc))
    if as_json:
        _emit_document(name, result)
        return
    if isinstance(result, dict):
        for run in result.get("handlers") or ():
            if isinstance(run, dict):
                print_report(run)  # what `relay function run` prints, per handler
                out()
    out(summary_line(result))


def _emit_document(name: str, result: Any) -> None:
    """``relay.function.invoke/1``; exits 1 after it when a handler failed."""
    if not isinstance(result, dict):
        fail("the worker's answer is malformed")
    runs = [run for run in result.get("handlers") or () if isinstance(run, dict)]
    failed = int(result.get("failed") or 0)
    emit_json("function.invoke", {
        "function": name,
        "invoked": int(result.get("invoked") or 0),
        "failed": failed,
        "error": str(result.get("error") or ""),
        "handlers": [report_json(run) for run in runs],
    })
    if failed or result.get("error"):
        raise typer.Exit(1)


def summary_line(result: Any) -> str:
    """``No matching handlers`` / ``Invoked 1 handler`` / ``Invoked N handlers``;
    exits non-zero with the first failure when a handler failed."""
    if not isinstance(result, dict):
        fail("the worker's answer is malformed")
    if result.get("error"):
        fail(str(result["error"]))
    count = int(result.get("invoked", 0))
    if count == 0:
        return "No matching handlers"
    return f"Invoked {count} handler{'s' if count != 1 else ''}"
