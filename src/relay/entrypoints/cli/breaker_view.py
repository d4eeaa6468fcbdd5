"""A function's circuit breaker as the live worker reports it, in words and as
data: the breaker line of ``relay function inspect`` (text and ``--json``) and
the answer of ``relay function breaker``. A shared helper: no command module."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from relay.adapters.control.client import request
from relay.domain.commands import GetBreaker
from relay.domain.durations import format_age
from relay.domain.errors import RelayError

_LABEL = 17  # the column every ``inspect`` value starts in


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
