"""``relay function breaker open|close NAME`` and the breaker line of ``inspect``.

Both talk to the live worker over the control socket: a breaker's state lives in
the worker's memory (per worker), not in the state database.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from relay.adapters.control.client import WorkerUnavailable, request
from relay.domain.commands import ForceBreaker, GetBreaker
from relay.domain.durations import format_age
from relay.domain.errors import RelayError
from relay.entrypoints.cli.common import fail, out
from relay.entrypoints.config import load_paths

_LABEL = 17  # the column every ``inspect`` value starts in

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


def fetch_breaker(socket: Path | str, name: str, *, timeout: float = 3.0) -> dict[str, Any] | None:
    """The live breaker of ``name``, or ``None`` when no worker answers or the
    worker does not know the function."""
    try:
        result = request(socket, GetBreaker(function=name), timeout=timeout)
    except RelayError:
        return None
    return result if isinstance(result, dict) else None


def breaker_document(snapshot: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``breaker`` of ``relay function inspect --json``: the live worker's
    breaker, ``null`` when no worker answers (its state lives only there)."""
    if snapshot is None:
        return None
    probe = snapshot.get("probe_in_s")
    return {
        "enabled": bool(snapshot.get("enabled")),
        "state": str(snapshot.get("state", "closed")),
        "forced": bool(snapshot.get("forced")),
        "failures": int(snapshot.get("failures") or 0),
        "cooldown_s": float(snapshot.get("cooldown_s") or 0.0),
        "probe_in_s": None if probe is None else float(probe),
    }


def breaker_lines(snapshot: Mapping[str, Any] | None, name: str) -> list[str]:
    """The ``Breaker:`` line of ``relay function inspect``."""
    if snapshot is None:
        value = "unknown (no answer from a worker)"
    elif not snapshot.get("enabled") and snapshot.get("state") == "closed":
        value = "off"
    else:
        value = describe(snapshot, name)
    return [f"{'Breaker:':<{_LABEL}}{value}"]


def describe(snapshot: Mapping[str, Any], name: str) -> str:
    """``closed``, ``closed (2 consecutive failures)``, ``open (probe in 12s)``,
    ``open (forced: ...)`` or ``half-open (one probe running)``."""
    state = str(snapshot.get("state", "closed"))
    if state == "half_open":
        return "half-open (one probe running, every other invocation held)"
    if state == "open":
        if snapshot.get("forced"):
            return f"open (forced: held until `relay function breaker close {name}`)"
        probe_in = snapshot.get("probe_in_s")
        cooldown = float(snapshot.get("cooldown_s") or 0)
        when = "" if probe_in is None else f"probe in {format_age(float(probe_in))}, "
        return f"open ({when}cooldown {format_age(cooldown)}; invocations held)"
    failures = int(snapshot.get("failures") or 0)
    if failures:
        plural = "" if failures == 1 else "s"
        return f"closed ({failures} consecutive failure{plural})"
    return "closed"
