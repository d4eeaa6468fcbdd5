"""The run history's rules: what one run row holds, and the per-minute rollups.

The run history is a projection of the invocation events for people (the web
console): it is never read to decide delivery. A *run* is one attempt that ended
(succeeded, failed with attempts left, or exhausted) or one manual invocation
(``relay function invoke`` or a dead-letter replay). A *rollup* counts, per
function and minute, the events received, the attempts that succeeded and
failed, the dead letters written, and the p50/p99 of the attempts' durations;
the row for :data:`ALL` counts every function together (an event matched by two
functions is received once there).
"""

from __future__ import annotations

import math
import random

import msgspec

from relay.domain.durations import DAY

DEFAULT_LIMIT = 10_000
"""``RUN_HISTORY_LIMIT``: the runs kept (the newest)."""
DEFAULT_RETENTION_NS = 7 * DAY
"""``RUN_HISTORY_RETENTION``: runs older than this are deleted."""
DEFAULT_ROLLUP_RETENTION_NS = 2 * DAY
"""``RUN_ROLLUP_RETENTION``: per-minute rollups older than this are deleted."""
QUEUE_CAPACITY = 10_000
"""Runs waiting to be written; beyond it a run is dropped (counted), never waited for."""
ERROR_CHARS = 1_000
"""An error is kept to this many characters (memory and the row stay bounded)."""
SAMPLES_PER_MINUTE = 512
"""Durations kept per function and minute for its percentiles (a uniform sample)."""

ALL = "*"
"""The rollup row that counts every function together."""

SUCCEEDED, FAILED, EXHAUSTED = "succeeded", "failed", "exhausted"
OUTCOMES = (SUCCEEDED, FAILED, EXHAUSTED)
"""``failed``: the attempt failed with attempts left; ``exhausted``: the last one failed."""
DELIVERY, MANUAL = "delivery", "manual"
"""A run's kind: an attempt of a delivered message, or ``function invoke``/a replay."""


class Run(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the run history."""

    at: float
    function: str
    handler: str
    outcome: str
    duration_s: float
    message_id: str = ""
    attempt: int = 0
    error: str = ""
    kind: str = DELIVERY


def clip_error(text: str) -> str:
    """The error as stored: one bounded piece of text."""
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 1] + "…"


def minute_of(at: float) -> int:
    """The minute a moment falls in, as epoch seconds of its start."""
    return int(at // 60) * 60


def percentile(sorted_values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile of already sorted values; None when empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class MinuteRollup:
    """One function's counts in one minute, with a bounded sample of durations."""

    __slots__ = ("dead_lettered", "durations", "failed", "received", "seen", "succeeded")

    def __init__(self) -> None:
        self.received = 0
        self.succeeded = 0
        self.failed = 0
        self.dead_lettered = 0
        self.seen = 0
        self.durations: list[float] = []

    def add_duration(self, duration_s: float, rng: random.Random) -> None:
        """Reservoir sampling: every duration of the minute is equally likely kept."""
        self.seen += 1
        if len(self.durations) < SAMPLES_PER_MINUTE:
            self.durations.append(duration_s)
            return
        slot = rng.randrange(self.seen)
        if slot < SAMPLES_PER_MINUTE:
            self.durations[slot] = duration_s

    def quantiles(self) -> tuple[float | None, float | None]:
        ordered = sorted(self.durations)
        return percentile(ordered, 0.50), percentile(ordered, 0.99)


class Rollups:
    """The minutes not yet closed, per function (and :data:`ALL`)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._minutes: dict[tuple[int, str], MinuteRollup] = {}
        self._rng = rng or random.Random()  # noqa: S311 - sampling, not security

    def bucket(self, at: float, function: str) -> MinuteRollup:
        key = (minute_of(at), function)
        found = self._minutes.get(key)
        if found is None:
            found = self._minutes[key] = MinuteRollup()
        return found

    def received(self, at: float, functions: tuple[str, ...]) -> None:
        self.bucket(at, ALL).received += 1
        for function in functions:
            self.bucket(at, function).received += 1

    def finished(self, run: Run) -> None:
        """Count one run (a manual one is not a delivery: it feeds no rollup)."""
        if run.kind != DELIVERY:
            return
        for function in (run.function, ALL):
            bucket = self.bucket(run.at, function)
            if run.outcome == SUCCEEDED:
                bucket.succeeded += 1
            else:
                bucket.failed += 1
            if run.duration_s > 0:
                bucket.add_duration(run.duration_s, self._rng)

    def dead_lettered(self, at: float, function: str) -> None:
        self.bucket(at, ALL).dead_lettered += 1
        if function != "-":
            self.bucket(at, function).dead_lettered += 1

    def items(self) -> list[tuple[int, str, MinuteRollup]]:
        return [(minute, fn, bucket) for (minute, fn), bucket in self._minutes.items()]

    def close_before(self, minute: int) -> None:
        """Forget minutes before ``minute`` (written for the last time already)."""
        for key in [key for key in self._minutes if key[0] < minute]:
            del self._minutes[key]
