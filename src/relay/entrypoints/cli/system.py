"""``relay start`` and ``relay health``."""

from __future__ import annotations

import typer

from relay.entrypoints.cli import trace as trace_cmd
from relay.entrypoints.cli.common import not_available


def register(app: typer.Typer) -> None:
    app.command("start", help="Run Relay in the foreground until SIGINT/SIGTERM.")(start)
    app.command("health", help="Check that Redis and Docker answer (exit 0 or 1).")(health)
    trace_cmd.register(app)


def start() -> None:
    not_available("start")


def health() -> None:
    not_available("health")
