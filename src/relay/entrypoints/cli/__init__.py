"""The ``relay`` command: one entry point for the daemon and every admin command.

Subcommands load lazily (``lazy.py``): this module imports typer and nothing of
the commands, so ``relay --version``, ``relay --help`` and every command start
without importing what only another command needs (``docs/cli.md``, Startup).
``main`` also keeps ``rich`` out of the process (see there).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from relay.entrypoints.cli.common import OneLineErrors
from relay.entrypoints.cli.help_format import RelayGroup
from relay.entrypoints.cli.lazy import Lazy, lazy_group

_CLI = "relay.entrypoints.cli"

# name -> where it lives, and the one line `relay --help` shows (checked against the
# command's own help by tests/unit/test_cli_startup.py); the order is the help's
COMMANDS = {
    "start": Lazy(f"{_CLI}.system:register", "Run Relay in the foreground until SIGINT/SIGTERM."),
    "health": Lazy(f"{_CLI}.system:register", "Check that Redis and Docker answer (exit 0 or 1)."),
    "trace": Lazy(f"{_CLI}.trace:register", "Show the life of one stream message."),
    "publish": Lazy(f"{_CLI}.publish:register", "Append events to the broker (embedded or Redis)."),
    "stats": Lazy(f"{_CLI}.stats:app", "Show or reset operational statistics."),
    "function": Lazy(f"{_CLI}.function:app", "Inspect, validate and exercise functions."),
    "dlq": Lazy(f"{_CLI}.dlq:app", "List, inspect, replay and remove dead-lettered entries."),
    "schedule": Lazy(f"{_CLI}.schedule:app", "Inspect cron schedules."),
    "secret": Lazy(f"{_CLI}.secret:app", "Manage local secrets."),
    "git": Lazy(f"{_CLI}.git:app", "Sync /functions from a git repository."),
    "backup": Lazy(
        f"{_CLI}.backup:register",
        "Copy the state database and the broker file, consistently, while Relay runs.",
    ),
}


class _Root(OneLineErrors, RelayGroup):
    """The root group: tidy help (``help_format``), one-line usage errors (``common``)."""


app = typer.Typer(
    name="relay",
    help=(
        "Relay: run functions in warm, hardened containers for events on a Redis Stream"
        " or the embedded broker."
    ),
    no_args_is_help=True,
    # `relay --install-completion` / `--show-completion` (bash, zsh, fish, powershell)
    add_completion=True,
    pretty_exceptions_enable=False,
    # Plain help: rich help prints a Python type beside every parameter (see help_format).
    rich_markup_mode=None,
    cls=lazy_group(COMMANDS, base=_Root),
)


def _print_version(wanted: bool) -> None:
    if wanted:
        from relay.entrypoints.version import version_line

        typer.echo(version_line(os.environ))
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version (and the commit, when known) and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Relay: run functions in warm, hardened containers for events on a Redis Stream."""


def main() -> None:
    # Relay renders its own help and log lines without rich, yet structlog imports
    # it when installed (for tracebacks it never draws here: ~0.15 s per command
    # that logs). None in sys.modules makes `import rich` fail as if rich were
    # absent, so structlog (and typer's completion) take their plain paths; the
    # console entry point only, so an embedding program keeps its rich.
    sys.modules.setdefault("rich", None)  # type: ignore[arg-type]  # None: "not installed"
    app()
