"""Ports: the roles Relay's use cases need from the outside world.

Each is a ``typing.Protocol`` named for its role. Adapters are named technology +
role (``RedisEventStream``); in-memory fakes for unit tests live in
``tests/fakes.py`` as ``InMemory...``. Each area owns its section below.
"""

from __future__ import annotations

from typing import Protocol


# --- time and randomness ---------------------------------------------------------
class Clock(Protocol):
    """Wall-clock and monotonic time, injected so decisions are testable."""

    def now(self) -> float:
        """Seconds since the epoch (UTC)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a monotonic clock, for timeouts and ages."""
        ...


class TokenSource(Protocol):
    """Random fencing tokens and ids."""

    def token(self) -> str: ...


# --- event stream and invocation ledger (delivery) --------------------------------
# --- container runtime (execution) ------------------------------------------------
# --- images and functions (lifecycle) ---------------------------------------------
# --- state view, stats and secrets -------------------------------------------------
