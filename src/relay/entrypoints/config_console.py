"""The console's and the run history's settings (issue 34), read by :mod:`config`.

``CONSOLE_ADDR`` turns the web console on. A bare ``:port`` (or a port alone)
binds loopback, unlike ``METRICS_ADDR``: the console can replay and remove dead
letters, so it is reachable beyond this host only when asked for by name
(``0.0.0.0:8089``), and then only with ``CONSOLE_TOKEN_SECRET``, the name of
the secret in the secret store whose value is the access token.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from relay.domain import run_history as rh
from relay.domain.names import hostname_problem

T = TypeVar("T")

LOOPBACK = "127.0.0.1"
_CONSOLE_ACCEPTS = (
    "a listen address host:port, :port or a port alone (1-65535; loopback by default)"
)


class Collector(Protocol):
    problems: list[str]

    def raw(self, name: str) -> str | None: ...

    def parse(self, name: str, parser: Callable[[str], T], default: T, accepts: str) -> T: ...


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """``host`` and ``port`` are None when the console is off."""

    host: str | None = None
    port: int | None = None
    token_secret: str | None = None

    @property
    def enabled(self) -> bool:
        return self.port is not None

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host or LOOPBACK)


@dataclass(frozen=True, slots=True)
class RunHistoryValues:
    limit: int = rh.DEFAULT_LIMIT
    retention_ns: int = rh.DEFAULT_RETENTION_NS
    rollup_retention_ns: int = rh.DEFAULT_ROLLUP_RETENTION_NS


@dataclass(frozen=True, slots=True)
class ObserveSettings:
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    run_history: RunHistoryValues = field(default_factory=RunHistoryValues)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_console_addr(value: str) -> tuple[str, int]:
    text = value.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    host = host.strip("[]")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535 or " " in host:
        raise ValueError(value)
    if host and not is_loopback(host) and host not in ("0.0.0.0", "::"):  # noqa: S104
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if hostname_problem(host) is not None:
                raise ValueError(value) from None
    return host or LOOPBACK, int(port_text)


def non_negative_int(value: str) -> int:
    text = value.strip()
    if not text.isdigit():
        raise ValueError(value)
    return int(text)


def observe_settings(
    c: Collector, positive_duration: Callable[[str], int]
) -> ObserveSettings:
    """``CONSOLE_ADDR``, ``CONSOLE_TOKEN_SECRET`` and the ``RUN_HISTORY_*`` limits."""
    addr: Any = c.parse("CONSOLE_ADDR", parse_console_addr, None, _CONSOLE_ACCEPTS)
    secret = c.raw("CONSOLE_TOKEN_SECRET")
    console = ConsoleSettings()
    if addr is not None:
        console = ConsoleSettings(host=addr[0], port=addr[1], token_secret=secret)
        if not console.loopback and secret is None:
            c.problems.append(
                f"CONSOLE_TOKEN_SECRET is required when CONSOLE_ADDR binds beyond loopback"
                f" ({addr[0]}): the name of a secret (relay secret set NAME) holding the"
                " console's access token"
            )
    history = RunHistoryValues(
        limit=c.parse("RUN_HISTORY_LIMIT", non_negative_int, rh.DEFAULT_LIMIT,
                      "a whole number of runs (0 turns the run history off)"),
        retention_ns=c.parse("RUN_HISTORY_RETENTION", positive_duration,
                             rh.DEFAULT_RETENTION_NS, "a positive duration such as 7d"),
        rollup_retention_ns=c.parse("RUN_ROLLUP_RETENTION", positive_duration,
                                    rh.DEFAULT_ROLLUP_RETENTION_NS,
                                    "a positive duration such as 2d"),
    )
    return ObserveSettings(console=console, run_history=history)
