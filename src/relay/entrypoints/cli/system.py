"""``relay start`` and ``relay health``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import anyio
import typer

from relay.entrypoints.cli.common import fail, out
from relay.entrypoints.cli.json_output import JsonFlag, emit_json


def register(app: typer.Typer) -> None:
    app.command("start", help="Run Relay in the foreground until SIGINT/SIGTERM.")(start)
    app.command("health", help="Check that Redis and Docker answer (exit 0 or 1).")(health)
    # `trace` registers itself (cli/__init__.py): `relay start` need not import redis


def start(
    functions: Annotated[
        Path,
        typer.Option(
            "--functions", metavar="DIR", help="Functions directory (default /functions)."
        ),
    ] = Path("/functions"),
    embedded: Annotated[
        bool,
        typer.Option("--embedded", help="Use the embedded SQLite broker (RELAY_BROKER=sqlite)."),
    ] = False,
    processes: Annotated[
        int,
        typer.Option(
            "--processes",
            min=1,
            metavar="N",
            help="Run N worker processes sharing the group or broker file (default 1).",
        ),
    ] = 1,
) -> None:
    """Consume events, build and run functions, reconcile live; blocks until signalled."""
    from relay.entrypoints.daemon import main as daemon_main  # heavy imports only here

    env = dict(os.environ)
    if embedded:
        env["RELAY_BROKER"] = "sqlite"
    raise typer.Exit(daemon_main(env, functions, processes=processes))


def health(as_json: JsonFlag = False) -> None:
    """Exit 0 when Redis and Docker answer, 1 with the failing check on stderr."""
    from relay.adapters.control.client import fetch_health
    from relay.entrypoints.config import load_paths
    from relay.entrypoints.health import check_health

    problem = anyio.run(check_health, dict(os.environ))
    # When a worker runs here, it must also report itself ready: each process of
    # `relay start --processes N` (one socket per process), the first failing named.
    sockets = load_paths(os.environ).sockets
    for socket in sockets:
        if problem is not None:
            break
        found = fetch_health(socket)
        if found is not None and len(sockets) > 1:
            found = f"process {socket.parent.name}: {found}"
        problem = found
    if as_json:
        from relay.entrypoints.cli.git import health_git

        # unhealthy is an answer, not a failure to answer: the document says so,
        # and the exit code and the stderr line stay what they are without --json
        emit_json("health", {"ok": problem is None, "problem": problem, "git": health_git()})
    if problem is not None:
        fail(problem)
    if as_json:
        return
    out("ok")
    from relay.entrypoints.cli.git import health_line

    line = health_line()  # only when a git source is configured
    if line is not None:
        out(line)
