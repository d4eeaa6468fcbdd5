"""Validation of a template's ``breaker`` key (see :mod:`relay.domain.breaker`).

``breaker`` is off when absent (or null). Present, it is a map whose keys are
all optional: ``failures`` (consecutive failed attempts that open it, 1 to
1000, default 5), ``window`` (how close together they must be, default 1m),
``cooldown`` (how long it stays open before one probe, default 30s) and
``max_cooldown`` (the cap of the doubling after failed probes, default 10m, at
least ``cooldown``). Durations are Go strings, positive, at most 24h.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from relay.domain.breaker import (
    DEFAULT_COOLDOWN_NS,
    DEFAULT_FAILURES,
    DEFAULT_MAX_COOLDOWN_NS,
    DEFAULT_WINDOW_NS,
    BreakerPolicy,
)
from relay.domain.durations import HOUR, format_duration
from relay.domain.template_rules import MISSING, check_keys, int_in_range, kind_of, timeout

KEYS: Final = ("failures", "window", "cooldown", "max_cooldown")
MAX_FAILURES: Final = 1000
MAX_BREAKER_DURATION_NS: Final = 24 * HOUR
_EXAMPLE: Final = "{failures: 5, window: 1m, cooldown: 30s, max_cooldown: 10m}"


def breaker(raw: object, problems: list[str]) -> BreakerPolicy | None:
    """The template's ``breaker`` policy, ``None`` when off (absent or null)."""
    if raw is MISSING or raw is None:
        return None
    if not isinstance(raw, Mapping):
        problems.append(f"breaker: must be a map such as {_EXAMPLE} (got {kind_of(raw)})")
        return None
    before = len(problems)
    check_keys(raw, KEYS, "breaker", problems)
    failures = int_in_range(
        raw.get("failures", MISSING), "breaker.failures", DEFAULT_FAILURES, 1, MAX_FAILURES,
        problems,
    )
    window = _duration(raw, "window", DEFAULT_WINDOW_NS, problems)
    cooldown = _duration(raw, "cooldown", DEFAULT_COOLDOWN_NS, problems)
    max_cooldown = _duration(raw, "max_cooldown", DEFAULT_MAX_COOLDOWN_NS, problems)
    if (
        len(problems) > before or failures is None or window is None
        or cooldown is None or max_cooldown is None
    ):  # fmt: skip
        return None
    if "max_cooldown" not in raw:
        max_cooldown = max(max_cooldown, cooldown)  # a long cooldown alone is no mistake
    if max_cooldown < cooldown:
        problems.append(
            f"breaker.max_cooldown: must be at least the cooldown ({format_duration(cooldown)}) "
            f"(got {format_duration(max_cooldown)})"
        )
        return None
    return BreakerPolicy(
        failures=failures, window_ns=window, cooldown_ns=cooldown, max_cooldown_ns=max_cooldown
    )


def _duration(
    raw: Mapping[object, object], key: str, default: int, problems: list[str]
) -> int | None:
    return timeout(
        raw.get(key, MISSING), f"breaker.{key}", MAX_BREAKER_DURATION_NS, default, problems
    )
