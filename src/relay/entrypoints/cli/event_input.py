"""The event a user hands to ``relay function match`` and ``relay function invoke``.

Exactly one source: ``--event JSON``, ``--file F``, or JSON piped on stdin when neither
flag is given. The event must be a JSON object (matching is defined over an object's
fields). A bare call with an interactive terminal on stdin fails fast instead of waiting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from relay.domain.errors import EventError
from relay.entrypoints.cli.common import usage

MAX_EVENT_INPUT_BYTES = 1024 * 1024  # the hard maximum event size of the stream


def read_event_argument(event: str | None, file: Path | None, stdin: IO[str]) -> dict[str, Any]:
    """Read and decode the event; raise :class:`EventError` with one clear line.
    Both flags at once is a wrong command line in every command (a usage error:
    exit 2, see ``common.usage``)."""
    if event is not None and file is not None:
        usage("--event and --file are mutually exclusive; give one")
    if event is not None:
        return parse_event(event, "--event")
    if file is not None:
        return parse_event(_read_file(file), str(file))
    if _is_terminal(stdin):
        raise EventError(
            "no event given: pass --event '{...}', --file event.json, or pipe JSON on stdin"
        )
    text = stdin.read(MAX_EVENT_INPUT_BYTES + 1)
    return parse_event(text, "stdin")


def parse_event(text: str, source: str) -> dict[str, Any]:
    """Decode ``text`` as a JSON object."""
    if len(text.encode("utf-8", errors="replace")) > MAX_EVENT_INPUT_BYTES:
        raise EventError(f"{source}: event is larger than {MAX_EVENT_INPUT_BYTES // 1024} KiB")
    if not text.strip():
        raise EventError(f"{source}: event is empty; expected a JSON object")
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise EventError(
            f"{source}: event is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from exc
    except ValueError as exc:
        raise EventError(f"{source}: event is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise EventError(f"{source}: event is nested too deeply") from exc
    if not isinstance(value, dict):
        raise EventError(f"{source}: event must be a JSON object, not {_json_kind(value)}")
    return value


def _read_file(file: Path) -> str:
    try:
        with file.open("rb") as handle:
            data = handle.read(MAX_EVENT_INPUT_BYTES + 1)
    except OSError as exc:
        raise EventError(f"{file}: cannot read the event file ({exc.strerror or exc})") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EventError(f"{file}: event file is not UTF-8 text") from exc


def _is_terminal(stdin: IO[str]) -> bool:
    try:
        return stdin.isatty()
    except (ValueError, OSError):  # a closed or detached stream
        return False


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not allowed in JSON")


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


# The --event/--file pair shared by `relay function invoke` and `relay function match`.
EventOption = Annotated[
    str | None, typer.Option("--event", help="The event as inline JSON (an object).")
]
FileOption = Annotated[
    Path | None, typer.Option("--file", help="Read the event from this JSON file.")
]
