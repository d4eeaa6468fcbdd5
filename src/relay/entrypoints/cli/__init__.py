"""The ``relay`` command: one entry point for the daemon and every admin command."""

from __future__ import annotations

import typer

from relay.entrypoints.cli import dlq, function, git, publish, schedule, secret, stats, system

app = typer.Typer(
    name="relay",
    help=(
        "Relay: run functions in warm, hardened containers for events on a Redis Stream"
        " or the embedded broker."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
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
