"""``relay function breaker open|close NAME`` and the breaker line of ``inspect``.

Both talk to the live worker over the control socket: a breaker's state lives in
the worker's memory (per worker), not in the state database.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from relay.adapters.control.client import WorkerUnavailable, request
from relay.domain.commands import ForceBreaker
from relay.domain.errors import RelayError
from relay.entrypoints.cli.breaker_view import describe
from relay.entrypoints.cli.common import fail, out
from relay.entrypoints.config import load_paths

app = typer.Typer(
    help="Force a function's circuit breaker on the live worker.", no_args_is_help=True
)


def register(parent: typer.Typer) -> None:
    parent.add_typer(app, name="breaker")


@app.command("open")
def open_(name: Annotated[str, typer.Argument(help="Function name.")]) -> None:
    """Hold every invocation of NAME (no attempt charged) until `breaker close`."""
    out(_force(name, "open"))


@app.command("close")
def close(name: Annotated[str, typer.Argument(help="Function name.")]) -> None:
    """Let NAME's invocations run again and forget its counted failures."""
    out(_force(name, "closed"))


def _force(name: str, state: str) -> str:
    socket = load_paths(os.environ).socket
    try:
        result = request(socket, ForceBreaker(function=name, state=state))
    except WorkerUnavailable as exc:
        fail(f"{exc}; `relay function breaker` needs a running worker (`relay start`)")
    except RelayError as exc:
        fail(str(exc))
    if not isinstance(result, dict):
        fail("the worker's answer is malformed")
    return f"{name}: breaker {describe(result, name)}"
