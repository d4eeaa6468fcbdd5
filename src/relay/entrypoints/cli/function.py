"""``relay function ...``. Each group of subcommands lives in its own module."""

from __future__ import annotations

import typer

from relay.entrypoints.cli import fn_authoring, fn_breaker, fn_catalog, fn_invoke

app = typer.Typer(help="Inspect, validate and exercise functions.", no_args_is_help=True)
fn_catalog.register(app)  # ls, inspect
fn_invoke.register(app)  # invoke
fn_authoring.register(app)  # validate, match
fn_breaker.register(app)  # breaker open|close
