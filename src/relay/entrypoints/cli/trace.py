"""``relay trace MESSAGE_ID``: the life of one stream message."""

from __future__ import annotations

import typer

from relay.entrypoints.cli.common import not_available


def register(app: typer.Typer) -> None:
    app.command("trace", help="Show the life of one stream message.")(trace)


def trace(message_id: str = typer.Argument(..., help="Stream message id")) -> None:
    not_available("trace")
