"""``relay function validate`` and ``relay function match``: no Docker or Redis needed."""

from __future__ import annotations

import typer

from relay.entrypoints.cli.common import not_available


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("match")(match)


def validate(paths: list[str]) -> None:
    """Validate function directories without Docker or Redis."""
    not_available("function validate")


def match(path: str) -> None:
    """Explain which rules match an event, and why the others do not."""
    not_available("function match")
