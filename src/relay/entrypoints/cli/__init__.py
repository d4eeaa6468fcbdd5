"""The ``relay`` command: one entry point for the daemon and every admin command."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from relay.entrypoints.cli import dlq, function, git, publish, schedule, secret, stats, system
from relay.entrypoints.cli.help_format import RelayGroup

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
    cls=RelayGroup,
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


system.register(app)
publish.register(app)
app.add_typer(stats.app, name="stats")
app.add_typer(function.app, name="function")
app.add_typer(dlq.app, name="dlq")
app.add_typer(schedule.app, name="schedule")
app.add_typer(secret.app, name="secret")
app.add_typer(git.app, name="git")


def main() -> None:
    app()
