"""``relay function ls --functions DIR`` and ``relay schedule ls --functions DIR``:
a functions directory's functions and schedules with no worker running.

The live forms read what a worker loaded (the state database, the broker); these
read the directory itself, through the loading ``relay function validate`` uses
(the template rules and the source checks), and give rows of the live forms'
shapes so the same tables and ``--json`` documents render them. What has no
offline value says so: a function's STATUS is ``valid`` or ``invalid`` (not a
build's state), UPDATED is ``-``, a schedule's LAST PUBLISHED is ``unknown``
(the broker is not read).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from relay.entrypoints.cli.common import fail
from relay.entrypoints.cli.fn_loading import Loaded, PathNotFound, discover, load

STATUS_VALID = "valid"
STATUS_INVALID = "invalid"
# schedule ls --json's last_published_error offline: why last_published is null
NOT_READ = "not read: --functions lists a directory, without a worker or the broker"


def loaded_functions(directory: Path) -> list[Loaded]:
    """Every function at ``directory`` (a functions directory or one function's),
    loaded and validated; exits 1 with one line when there is none."""
    try:
        found = discover(directory)
    except PathNotFound as exc:
        fail(str(exc))
    return [load(name, path) for name, path in found]


def function_rows(functions: list[Loaded]) -> list[dict[str, Any]]:
    """Rows for ``render_ls``/``ls_document``."""
    return [
        {
            "name": f.name,
            "runtime": f.template.runtime if f.template is not None else None,
            "status": STATUS_VALID if f.template is not None else STATUS_INVALID,
        }
        for f in functions
    ]


def schedule_rows(functions: list[Loaded]) -> list[tuple[str, Mapping[str, Any]]]:
    """(function, schedule) rows for ``render_schedules``/``schedules_document``,
    of the valid functions only, sorted by function then in declaration order."""
    rows: list[tuple[str, Mapping[str, Any]]] = []
    for f in sorted(functions, key=lambda f: f.name):
        if f.template is None:
            continue
        rows += [
            (f.name, {"handler": s.handler, "cron": s.cron, "timezone": s.timezone})
            for s in f.template.schedules
        ]
    return rows


def warn_invalid(functions: list[Loaded], directory: Path) -> None:
    """One stderr line when some functions are invalid (never the exit status:
    listing is not validating)."""
    invalid = sum(f.template is None for f in functions)
    if invalid:
        typer.echo(
            f"relay: {invalid} invalid function{'s' if invalid != 1 else ''} in {directory};"
            f" `relay function validate {directory}` says why",
            err=True,
        )
