"""Which dead-letter entries a bulk ``relay dlq ls|rm|replay`` acts on, and how fast.

One :class:`Selection` is built from the command line once (``--function``,
``--handler``, ``--since``, ``--until``, ``--before``, ``--reason``, ``--limit``)
and every bulk command filters with it, so ``ls`` shows exactly what ``rm`` or
``replay`` with the same flags would touch. Times compare against when the entry
was written: the millisecond part of its id, which both brokers assign at write.

A time bound is either a duration (``1h``, ``7d``: ``parse_setting_duration``)
counted back from now (``--since 1h``) or an absolute RFC 3339 time
(``--until 2026-01-02T03:04:05Z``; a bare date means its midnight UTC).
Parsing is pure: ``now_ms`` comes in as an argument.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Final

from relay.domain.durations import MILLISECOND, DurationError, parse_setting_duration

__all__ = [
    "InvalidSelection",
    "RateLimit",
    "Selection",
    "parse_limit",
    "parse_rate",
    "parse_time_bound",
]

DEFAULT_RATE: Final = "10/s"
_RATE = re.compile(r"(?P<n>\d+(?:\.\d+)?)\s*(?:/\s*(?P<unit>s|m|h))?")
_PER: Final = {"s": 1.0, "m": 60.0, "h": 3600.0}
MAX_RATE_PER_S: Final = 1000.0


class InvalidSelection(ValueError):
    """A selection flag's value is not what it accepts; the message is one line."""


@dataclass(frozen=True, slots=True)
class Selection:
    """The entries chosen by the selection flags; ``None`` means "any"."""

    function: str | None = None
    handler: str | None = None
    since_ms: int | None = None
    """Written at or after this (inclusive)."""
    until_ms: int | None = None
    """Written at or before this (inclusive); ``--before T`` sets ``T - 1``."""
    reason: str | None = None
    """A case-insensitive substring of the entry's ``reason``."""
    limit: int | None = None
    """At most this many entries, oldest first for ``rm``/``replay``."""

    @property
    def narrows(self) -> bool:
        """Whether any flag restricts the set (bulk ``rm`` refuses "everything")."""
        bounds = (self.function, self.handler, self.since_ms, self.until_ms, self.reason)
        return any(value is not None for value in bounds) or self.limit is not None

    def matches(self, *, function: str, handler: str, reason: str, written_ms: int) -> bool:
        """Whether one entry is selected (``limit`` is applied by the caller)."""
        if self.function is not None and function != self.function:
            return False
        if self.handler is not None and handler != self.handler:
            return False
        if self.since_ms is not None and written_ms < self.since_ms:
            return False
        if self.until_ms is not None and written_ms > self.until_ms:
            return False
        return self.reason is None or self.reason.casefold() in reason.casefold()

    def describe(self) -> str:
        """The flags as an operator would read them back, for prompts and summaries."""
        parts = []
        if self.function is not None:
            parts.append(f"function {self.function}")
        if self.handler is not None:
            parts.append(f"handler {self.handler}")
        if self.since_ms is not None:
            parts.append(f"written since {_iso(self.since_ms)}")
        if self.until_ms is not None:
            parts.append(f"written until {_iso(self.until_ms)}")
        if self.reason is not None:
            parts.append(f"reason containing {self.reason!r}")
        if self.limit is not None:
            parts.append(f"at most {self.limit}")
        return ", ".join(parts) or "every entry"


def parse_time_bound(flag: str, text: str, *, now_ms: int) -> int:
    """``1h`` (that long before ``now_ms``) or an RFC 3339 time, as epoch milliseconds."""
    value = text.strip()
    try:
        ns = parse_setting_duration(value)
    except DurationError:
        pass
    else:
        if ns < 0:
            raise InvalidSelection(f"{flag} {text!r} is invalid: a duration must not be negative")
        return now_ms - ns // MILLISECOND
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            moment = datetime.combine(date.fromisoformat(value), datetime.min.time(), UTC)
        else:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidSelection(
            f"{flag} {text!r} is invalid: expected a duration such as 1h, 30m or 7d, "
            "or an RFC 3339 time such as 2026-01-02T03:04:05Z"
        ) from None
    if moment.tzinfo is None:
        raise InvalidSelection(
            f"{flag} {text!r} is invalid: an RFC 3339 time needs a zone (Z or +01:00)"
        )
    return int(moment.timestamp() * 1000)


def parse_limit(text: str, *, zero_means_all: bool = False) -> int | None:
    """A positive whole number of entries (``ls``: ``0`` too, meaning no limit)."""
    value = text.strip()
    if zero_means_all and value == "0":
        return None
    if not value.isdigit() or int(value) <= 0:
        accepts = "a positive whole number" + (", or 0 for all" if zero_means_all else "")
        raise InvalidSelection(f"--limit {text!r} is invalid: expected {accepts}")
    return int(value)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``per_s`` replays a second: replay ``i`` (from 0) starts no earlier
    than ``i / per_s`` seconds after the first, so ``n`` replays take at least
    ``(n - 1) / per_s`` seconds however fast each one is."""

    per_s: float

    def start_offset_s(self, index: int) -> float:
        return index / self.per_s

    def wait_s(self, index: int, elapsed_s: float) -> float:
        """How long to wait before replay ``index``, ``elapsed_s`` after the first began."""
        return max(0.0, self.start_offset_s(index) - elapsed_s)


def parse_rate(text: str) -> RateLimit:
    """``5/s``, ``120/m``, ``1000/h`` or a bare ``5`` (per second)."""
    m = _RATE.fullmatch(text.strip())
    per_s = float(m["n"]) / _PER[m["unit"] or "s"] if m else 0.0
    if not m or per_s <= 0 or per_s > MAX_RATE_PER_S:
        raise InvalidSelection(
            f"--rate {text!r} is invalid: expected a positive rate such as 5/s, 120/m "
            f"or 1000/h (at most {MAX_RATE_PER_S:g}/s)"
        )
    return RateLimit(per_s)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")
