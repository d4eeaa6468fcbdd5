"""Helpers every CLI module shares: one-line errors and exit codes."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
from typer._click import Context
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (128 + SIGINT, as shells report it); what was done is printed."""


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print one line to stderr and exit with ``code``; never a traceback."""
    typer.echo(f"relay: {message}", err=True)
    raise typer.Exit(code)


def note(message: str) -> None:
    """One ``relay: note:`` line on stderr: what the command did differently from
    what one might expect (stdout stays the command's output alone)."""
    typer.echo(f"relay: note: {message}", err=True)


def usage(message: str) -> NoReturn:
    """A wrong command line found in a command's body (a value typer cannot check,
    two options that exclude each other): raised as click's usage error, so the
    root group prints it as every other one (one line, exit 2; ``OneLineErrors``)."""
    raise UsageError(message)


class OneLineErrors:
    """Mixed into the root group: every usage error of every command, whether click
    found it (an unknown option, a value typer could not convert, a missing
    argument) or a command raised it (``typer.BadParameter``), is one ``relay:``
    line and exit 2, not click's usage block and ``Error:`` line. Parsing and
    running a subcommand both happen inside the root's ``make_context`` and
    ``invoke``, so these two methods are the one place that sees them all."""

    def make_context(self, *args: Any, **kwargs: Any) -> Context:
        with one_line_errors():
            return super().make_context(*args, **kwargs)  # type: ignore[misc, no-any-return]

    def invoke(self, ctx: Context) -> Any:
        with one_line_errors():
            return super().invoke(ctx)  # type: ignore[misc]


@contextmanager
def one_line_errors() -> Iterator[None]:
    try:
        yield
    except NoArgsIsHelpError:
        raise  # `relay` or `relay dlq` alone: the help, as asked for (exit 2)
    except UsageError as exc:
        typer.echo(usage_line(exc), err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except ClickException as exc:  # e.g. a file option that cannot be opened
        typer.echo(f"relay: {_one_line(exc.format_message())}", err=True)
        raise typer.Exit(exc.exit_code) from None


def usage_line(exc: UsageError) -> str:
    """``relay: <what is wrong> (see 'relay dlq ls --help')``: the hint names the
    command whose line was wrong, the one place its usage is spelled out."""
    message = _one_line(exc.format_message())
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]  # "No such option" reads mid-line
    where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return f"relay: {message}{where}"


def _one_line(text: str) -> str:
    return " ".join(text.split()).rstrip(".")


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
