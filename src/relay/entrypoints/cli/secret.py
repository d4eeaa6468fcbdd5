"""``relay secret ls|set|rm``: the local secret store."""

from __future__ import annotations

import typer

from relay.entrypoints.cli.common import not_available

app = typer.Typer(help="Manage local secrets.", no_args_is_help=True)


@app.command("ls")
def ls() -> None:
    """List secret names."""
    not_available("secret ls")


@app.command("set")
def set_(name: str) -> None:
    """Set a secret from a hidden prompt or from all of stdin."""
    not_available("secret set")


@app.command("rm")
def rm(name: str) -> None:
    """Remove a secret."""
    not_available("secret rm")
