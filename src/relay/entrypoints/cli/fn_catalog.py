"""``relay function ls`` and ``relay function inspect``: read the state database only."""

from __future__ import annotations

import typer

from relay.entrypoints.cli.common import not_available


def register(app: typer.Typer) -> None:
    app.command("ls")(ls)
    app.command("inspect")(inspect_)


def ls() -> None:
    """List loaded functions."""
    not_available("function ls")


def inspect_(name: str) -> None:
    """Show one function's state, handlers, stats and runtime pool."""
    not_available("function inspect")
