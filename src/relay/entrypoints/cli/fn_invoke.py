"""``relay function invoke``: run matching handlers on the live worker."""

from __future__ import annotations

import typer

from relay.entrypoints.cli.common import not_available


def register(app: typer.Typer) -> None:
    app.command("invoke")(invoke)


def invoke(name: str) -> None:
    """Run a function's matching handlers on the live worker."""
    not_available("function invoke")
