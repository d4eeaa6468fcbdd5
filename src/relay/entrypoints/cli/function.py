"""``relay function ...``: list, inspect, invoke, validate, match."""

from __future__ import annotations

import typer

from relay.entrypoints.cli.common import not_available

app = typer.Typer(help="Inspect and exercise functions.", no_args_is_help=True)


@app.command("ls")
def ls() -> None:
    """List loaded functions."""
    not_available("function ls")


@app.command("inspect")
def inspect_(name: str) -> None:
    """Show one function's state, handlers, stats and runtime pool."""
    not_available("function inspect")


@app.command("invoke")
def invoke(name: str) -> None:
    """Run a function's matching handlers on the live worker."""
    not_available("function invoke")


@app.command("validate")
def validate(paths: list[str]) -> None:
    """Validate function directories without Docker or Redis."""
    not_available("function validate")


@app.command("match")
def match(path: str) -> None:
    """Explain which rules match an event, and why the others do not."""
    not_available("function match")
