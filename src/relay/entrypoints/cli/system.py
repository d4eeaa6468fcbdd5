"""``relay start``, ``relay health`` and ``relay trace``."""

from __future__ import annotations

import typer

from relay.entrypoints.cli.common import not_available


def register(app: typer.Typer) -> None:
    app.command("start", help="Run Relay in the foreground until SIGINT/SIGTERM.")(start)
    app.command("health", help="Check that Redis and Docker answer (exit 0 or 1).")(health)
    app.command("trace", help="Show the life of one stream message.")(trace)


def start() -> None:
    not_available("start")


def health() -> None:
    not_available("health")


def trace(message_id: str = typer.Argument(..., help="Stream message id")) -> None:
    not_available("trace")
