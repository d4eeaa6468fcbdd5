"""What ``relay function validate`` prints: text (the default), ``--json`` (the
``function.validate`` document, docs/schemas) or ``--format github`` (GitHub
Actions annotations, ``::error file=F,line=N::message``, so a workflow step marks
the template line in the pull request). Checking is ``fn_loading``'s; this
module only locates each problem (the template file and its line) and prints it.

A problem is ``<field>: <why>`` (``events[0].pattern: is required``) or, for YAML
the parser refused, ``<file>:<line>: <why>``; the field's line is looked up in the
template (``field_line``), a missing field at its parent's line, and a problem
with neither (a function name, a source file) at line 1 of the template.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from relay.adapters.fs.templates import MAX_TEMPLATE_BYTES, TEMPLATE_FILE, field_line
from relay.entrypoints.cli.common import out, usage
from relay.entrypoints.cli.json_output import emit_json

if TYPE_CHECKING:
    from relay.entrypoints.cli.fn_loading import Loaded

FORMATS = ("text", "json", "github")
FormatOption = Annotated[
    str | None,
    typer.Option("--format", metavar="FORMAT",
                 help="text (default), json (as --json) or github (Actions annotations)."),
]  # fmt: skip
_FIELD = re.compile(r"(?P<field>[A-Za-z_][\w-]*(?:\[\d+\]|\.[^\s:.\[\]]+)*): ")
_LOCATED = re.compile(r"(?P<file>.+?):(?P<line>\d+): (?P<why>.*)", re.DOTALL)


@dataclass(frozen=True)
class Checked:
    """One PATH argument: the functions found there, or why none could be."""

    path: Path
    error: str | None
    functions: list[Loaded]


@dataclass(frozen=True)
class Located:
    message: str  # without a file:line prefix
    field: str | None
    line: int | None


def chosen_format(as_json: bool, output_format: str | None) -> str:
    """The output format, or a usage error (exit 2) for an unknown or a conflicting one."""
    if output_format is not None and output_format not in FORMATS:
        usage(f"--format {output_format!r} is invalid: one of {', '.join(FORMATS)}")
    if as_json and output_format not in (None, "json"):
        usage(f"--json and --format {output_format} cannot be combined: choose one")
    return "json" if as_json else output_format or "text"


def report(checked: list[Checked], output_format: str) -> bool:
    """Print the results; ``True`` when something is invalid (exit 1)."""
    failed = any(c.error is not None or any(f.problems for f in c.functions) for c in checked)
    if output_format == "json":
        emit_json("function.validate", {"ok": not failed, **_document(checked)})
    for c in checked:
        if c.error is not None:
            typer.echo(f"relay: {c.error}", err=True)
            if output_format == "github":
                out(f"::error::{_escape(c.error)}")
        if output_format != "json":
            for loaded in c.functions:
                _print_function(loaded, github=output_format == "github")
    return failed


def _print_function(loaded: Loaded, *, github: bool) -> None:
    if not loaded.problems:
        out(f"ok {loaded.name}")
        return
    template = _shown(loaded.directory / TEMPLATE_FILE)
    for problem, where in zip(loaded.problems, locate(loaded), strict=True):
        if not github:
            out(f"{loaded.name}: {problem}")
            continue
        props = f"file={_escape(template, prop=True)},line={where.line or 1}"
        out(f"::error {props},title=relay function validate::"
            f"{_escape(f'{loaded.name}: {where.message}')}")  # fmt: skip


def locate(loaded: Loaded) -> list[Located]:
    """Each problem of ``loaded`` with its field and template line, when known."""
    text = _template_text(loaded.directory / TEMPLATE_FILE)
    found: list[Located] = []
    for problem in loaded.problems:
        yaml_error = _LOCATED.fullmatch(problem)
        if yaml_error and yaml_error["file"].endswith(TEMPLATE_FILE):
            found.append(Located(yaml_error["why"], None, int(yaml_error["line"])))
            continue
        field = _FIELD.match(problem)
        name = field["field"] if field else None
        line = field_line(text, name) if name and text is not None else None
        found.append(Located(problem, name, line))
    return found


def _document(checked: list[Checked]) -> dict[str, Any]:
    functions = [
        {
            "name": loaded.name,
            "path": str(loaded.directory),
            "template": str(loaded.directory / TEMPLATE_FILE),
            "ok": not loaded.problems,
            "problems": [
                {"message": where.message, "field": where.field, "line": where.line}
                for where in locate(loaded)
            ],
        }
        for c in checked
        for loaded in c.functions
    ]
    errors = [{"path": str(c.path), "message": c.error} for c in checked if c.error]
    return {"functions": functions, "errors": errors}


def _template_text(path: Path) -> str | None:
    try:
        with path.open("rb") as handle:
            return handle.read(MAX_TEMPLATE_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None


def _shown(path: Path) -> str:
    """The path as GitHub resolves annotations: relative to the working directory
    (the checkout, in a workflow) when it lies under it."""
    if path.is_absolute():
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(path)
    return os.path.normpath(path)


def _escape(text: str, *, prop: bool = False) -> str:
    """GitHub's workflow-command escaping (a message's newline must not end it)."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text
