"""``relay dlq ...``: the dead-letter stream."""

from __future__ import annotations

import typer

from relay.entrypoints.cli.common import not_available

app = typer.Typer(help="List, inspect, replay and remove dead-lettered entries.", no_args_is_help=True)


@app.command("ls")
def ls() -> None:
    """List dead-lettered entries."""
    not_available("dlq ls")


@app.command("inspect")
def inspect_(entry_id: str) -> None:
    """Show one entry's metadata and original event."""
    not_available("dlq inspect")


@app.command("replay")
def replay(entry_id: str) -> None:
    """Re-run one entry's exact handler; delete the entry on success."""
    not_available("dlq replay")


@app.command("rm")
def rm(entry_id: str) -> None:
    """Delete one dead-lettered entry."""
    not_available("dlq rm")
