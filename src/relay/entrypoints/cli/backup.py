"""``relay backup PATH``: a consistent copy of the state database and, on the embedded
broker, of the broker file, taken while Relay runs (``docs/operations.md``, Backup and
restore). The copying is ``relay.adapters.sqlite.backup``'s; this module picks the
files from the environment and prints one line per file, or one line and exit 1.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from relay.domain.errors import RelayError
from relay.entrypoints.cli.common import fail, out
from relay.entrypoints.config import load_broker_choice, load_paths

HELP = "Copy the state database and the broker file, consistently, while Relay runs."
STATE_NAME = "db.sqlite3"
BROKER_NAME = "broker.sqlite3"


def register(app: typer.Typer) -> None:
    app.command("backup", help=HELP)(backup)


def backup(
    directory: Annotated[
        Path, typer.Argument(metavar="PATH", help="The directory to write the backup into.")
    ],
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite a backup already in PATH.")
    ] = False,
) -> None:
    from relay.adapters.sqlite.backup import back_up_all

    try:
        copies = back_up_all(_sources(), directory, force=force)
    except RelayError as exc:
        fail(str(exc))
    for copied in copies:
        out(f"Backed up {copied.source} to {copied.target} ({copied.size} bytes)")


def _sources() -> dict[str, Path]:
    """Backup file name -> live file: the state database, and the broker file when
    ``RELAY_BROKER=sqlite`` (a Redis broker is backed up with Redis's own tools)."""
    try:
        broker = load_broker_choice(os.environ)
    except RelayError as exc:
        fail("; ".join(str(exc).splitlines()))
    sources = {STATE_NAME: load_paths(os.environ).database}
    if broker.file is not None:
        sources[BROKER_NAME] = broker.file
    return sources
