"""Helpers every CLI module shares: one-line errors and exit codes."""

from __future__ import annotations

import sys
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


def out(line: str = "") -> None:
    sys.stdout.write(line + "\n")
