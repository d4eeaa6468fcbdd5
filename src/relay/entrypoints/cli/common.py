"""Helpers every CLI module shares: one-line errors and exit codes."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import typer

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (128 + SIGINT, as shells report it); what was done is printed."""


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print one line to stderr and exit with ``code``; never a traceback."""
    typer.echo(f"relay: {message}", err=True)
    raise typer.Exit(code)


def not_available(command: str) -> NoReturn:
    """For commands present in the tree whose feature has not landed yet."""
    fail(f"'{command}' is not available yet in this version", EXIT_USAGE)


def state_dir_problem(state_dir: Path) -> str | None:
    """Why the state directory cannot be read, or ``None``. A read command pointed at
    a directory that is not there (a typo in ``RELAY_STATE_DIR``) fails with this
    line instead of printing an empty answer that looks like "nothing here"."""
    where = f"state directory {state_dir}"
    if not state_dir.exists():
        return f"{where} does not exist (RELAY_STATE_DIR names it)"
    if not state_dir.is_dir():
        return f"{where} is not a directory (RELAY_STATE_DIR names it)"
    if not os.access(state_dir, os.R_OK | os.X_OK):
        return f"{where} cannot be read by this user (RELAY_STATE_DIR names it)"
    return None


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")
