"""``relay stats`` and ``relay stats reset``."""

from __future__ import annotations

import typer

from relay.entrypoints.cli.common import not_available

app = typer.Typer(help="Show or reset operational statistics.", invoke_without_command=True)


@app.callback()
def show(ctx: typer.Context) -> None:
    """Show the latest persisted statistics."""
    if ctx.invoked_subcommand is None:
        not_available("stats")


@app.command("reset")
def reset() -> None:
    """Zero the persisted cumulative statistics."""
    not_available("stats reset")
