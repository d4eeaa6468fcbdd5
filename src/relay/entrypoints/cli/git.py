"""``relay git ...``: sync functions from an SSH git repository."""

from __future__ import annotations

import typer

from relay.entrypoints.cli.common import not_available

app = typer.Typer(help="Sync /functions from a git repository.", no_args_is_help=True)


@app.command("keygen")
def keygen() -> None:
    """Generate an SSH deploy key."""
    not_available("git keygen")


@app.command("set")
def set_(repository: str) -> None:
    """Set the SSH git source to sync from."""
    not_available("git set")


@app.command("sync")
def sync() -> None:
    """Sync the source into /functions now."""
    not_available("git sync")


@app.command("status")
def status() -> None:
    """Show the git sync state."""
    not_available("git status")


@app.command("remove")
def remove() -> None:
    """Forget the source and drop the checkout."""
    not_available("git remove")
