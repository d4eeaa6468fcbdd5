"""Go-style durations (``90s``, ``1h30m``, ``1.5s``, ``300ms``).

The spec fixes Go's ``time.ParseDuration`` syntax for every duration Relay accepts:
a sequence of decimal numbers, each with an optional fraction and a mandatory unit.
A bare number such as ``300`` is not a duration (Go only accepts the bare ``0``; we
reject it too for settings, where a unitless zero is always a mistake).

Durations are integer nanoseconds, like Go's, so arithmetic never drifts.

What an operator types (every duration flag and environment variable) is read by
:func:`parse_setting_duration`: the same syntax plus ``d`` for 24 hours (``7d``,
``1d12h``), because retention is said in days. Template timeouts and ``now()``
offsets stay exactly Go's (:func:`parse_duration`), as the spec fixes them.
docs/configuration.md (Durations) documents the syntax once.
"""

from __future__ import annotations

import re
from typing import Final

NANOSECOND = 1
MICROSECOND = 1_000
MILLISECOND = 1_000_000
SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR

_UNITS: dict[str, int] = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "µs": MICROSECOND,  # U+00B5 micro sign
    "μs": MICROSECOND,  # U+03BC greek mu
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
    "d": DAY,  # parse_setting_duration only: Go's syntax has no days
}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_PART_OR_DAYS = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h|d)")
# The whole of a Go duration with units, as a regular expression for other tools
# (the template's JSON Schema); parse_duration itself walks _PART.
GO_DURATION_PATTERN: Final = rf"^\s*[+-]?(?:{_PART.pattern})+\s*$"
_MAX = (1 << 63) - 1


class DurationError(ValueError):
    """The text is not a Go duration."""


def parse_duration(text: str) -> int:
    """Parse a Go duration into integer nanoseconds; raise :class:`DurationError`."""
    return _parse(text, _PART)


def parse_setting_duration(text: str) -> int:
    """A duration an operator typed (a flag or an environment variable): Go's
    syntax plus ``d`` (24 hours), in integer nanoseconds; raise :class:`DurationError`."""
    return _parse(text, _PART_OR_DAYS)


def _parse(text: str, part: re.Pattern[str]) -> int:
    s = text.strip()
    if not s:
        raise DurationError("empty duration")
    sign = 1
    if s[0] in "+-":
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if not s:
        raise DurationError(f"invalid duration {text!r}")
    total = 0
    pos = 0
    while pos < len(s):
        m = part.match(s, pos)
        if m is None:
            raise DurationError(f"invalid duration {text!r}")
        number, unit = m.group(1), m.group(2)
        whole, _, frac = number.partition(".")
        scale = _UNITS[unit]
        value = int(whole or "0") * scale
        if frac:
            value += int(frac) * scale // (10 ** len(frac))
        total += value
        if total > _MAX:
            raise DurationError(f"invalid duration {text!r}: out of range")
        pos = m.end()
    return sign * total


def format_duration(ns: int) -> str:
    """Render nanoseconds the way Go's ``Duration.String`` does for common values.

    Whole units are compact (``6s``, ``1m30s``, ``2h0m0s`` becomes ``2h``), which is
    what ``relay function inspect`` shows next to a handler.
    """
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < SECOND:
        for unit, scale in (("ms", MILLISECOND), ("µs", MICROSECOND)):
            if ns >= scale:
                return sign + _trim(ns / scale) + unit
        return f"{sign}{ns}ns"
    hours, rest = divmod(ns, HOUR)
    minutes, rest = divmod(rest, MINUTE)
    seconds = rest / SECOND
    out = ""
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    if seconds:
        out += _trim(seconds) + "s"
    return sign + out


def format_age(seconds: float) -> str:
    """Short age such as ``2m14s`` for gauges like the oldest pending entry."""
    total = int(seconds)
    return format_duration(total * SECOND)


def _trim(value: float) -> str:
    text = f"{value:.9f}".rstrip("0").rstrip(".")
    return text or "0"
