"""Operational statistics as plain data: what is persisted and how a reset works.

The worker's Prometheus registry is the live source; a :class:`StatsSnapshot`
is its cumulative counters (plus the backlog gauges) at one moment, and the
four per-function ``Last*`` execution timestamps. A reset never touches
Prometheus: the worker keeps the snapshot taken at the reset as a baseline and
persists ``current - baseline`` from then on (a timestamp counts only when it is
newer than the baseline's).
"""

from __future__ import annotations

from typing import Final

import msgspec

# Global cumulative counters (the ``stats`` row) and the global backlog gauges.
GLOBAL_COUNTERS: Final = (
    "events_received",
    "events_matched",
    "events_unmatched",
    "handler_success",
    "handler_failure",
    "retries",
    "dlq_entries",
)
BACKLOG_GAUGES: Final = ("pending_entries", "oldest_pending_age_seconds", "delayed_entries")
GLOBAL_KEYS: Final = GLOBAL_COUNTERS + BACKLOG_GAUGES

# Per-function cumulative counters (one ``function_stats`` row each).
FUNCTION_COUNTERS: Final = (
    "events_matched",
    "handler_success",
    "handler_failure",
    "retries",
    "dlq_entries",
    "warm_acquires",
    "cold_starts",
    "discarded",
)

# Per-function "Last*" execution timestamps (epoch seconds in a snapshot, RFC3339 UTC
# in the ``function_stats`` row; absent until the first such execution or after a
# reset): the last matched event, handler success, handler failure and DLQ entry.
FUNCTION_TIMESTAMPS: Final = (
    "last_matched_at",
    "last_success_at",
    "last_failure_at",
    "last_dlq_at",
)


class StatsSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Global values (``GLOBAL_KEYS``), per-function counters (``FUNCTION_COUNTERS``)
    and per-function ``Last*`` timestamps (``FUNCTION_TIMESTAMPS``, epoch seconds).

    Absent counters read as zero; absent timestamps were never set. ``updated_at``
    is the epoch second the snapshot was persisted (``None`` when it never was).
    """

    totals: dict[str, int] = msgspec.field(default_factory=dict)
    functions: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)
    updated_at: float | None = None
    timestamps: dict[str, dict[str, float]] = msgspec.field(default_factory=dict)

    def total(self, key: str) -> int:
        return self.totals.get(key, 0)

    def function(self, name: str) -> dict[str, int]:
        """Every per-function counter of ``name``, zero when absent."""
        found = self.functions.get(name, {})
        return {key: found.get(key, 0) for key in FUNCTION_COUNTERS}

    def last(self, name: str) -> dict[str, float]:
        """The ``Last*`` timestamps of ``name`` that are set (``FUNCTION_TIMESTAMPS`` keys)."""
        found = self.timestamps.get(name, {})
        return {key: found[key] for key in FUNCTION_TIMESTAMPS if key in found}

    def function_names(self) -> list[str]:
        """Every function with counters or timestamps, sorted."""
        return sorted({*self.functions, *self.timestamps})


def since_baseline(current: StatsSnapshot, baseline: StatsSnapshot) -> StatsSnapshot:
    """The counters accumulated since ``baseline``; gauges unchanged.

    Counters only grow, so a value below its baseline means the series started
    again from zero after the baseline was taken (a function removed and added
    back): everything it holds then counts as accumulated since the baseline.
    A ``Last*`` timestamp is kept only when it moved after the baseline was taken.
    """
    totals = {key: current.total(key) for key in BACKLOG_GAUGES}
    for key in GLOBAL_COUNTERS:
        totals[key] = _since(current.total(key), baseline.total(key))
    functions = {}
    for name in current.functions:
        now, base = current.function(name), baseline.function(name)
        functions[name] = {key: _since(now[key], base[key]) for key in FUNCTION_COUNTERS}
    timestamps = {}
    for name in current.timestamps:
        before = baseline.last(name)
        moved = {k: v for k, v in current.last(name).items() if k not in before or v > before[k]}
        if moved:
            timestamps[name] = moved
    return StatsSnapshot(
        totals=totals, functions=functions, updated_at=current.updated_at, timestamps=timestamps
    )


def _since(value: int, base: int) -> int:
    return value - base if value >= base else value


def zeroed(snapshot: StatsSnapshot) -> StatsSnapshot:
    """The reset form of a persisted snapshot: counters zero and ``Last*`` timestamps
    gone, every function's row kept, gauges kept."""
    totals = {key: snapshot.total(key) for key in BACKLOG_GAUGES}
    totals.update(dict.fromkeys(GLOBAL_COUNTERS, 0))
    functions = {name: dict.fromkeys(FUNCTION_COUNTERS, 0) for name in snapshot.function_names()}
    return StatsSnapshot(totals=totals, functions=functions, updated_at=snapshot.updated_at)


def combined(snapshots: list[StatsSnapshot]) -> StatsSnapshot:
    """The stats of one host running several worker processes (``relay start
    --processes N``): counters add up; the backlog gauges are one consumer group's,
    sampled by each process, so the latest sample is kept, not the sum; each
    ``last_*`` time is the latest."""
    if len(snapshots) == 1:
        return snapshots[0]
    newest = max(snapshots, key=lambda s: s.updated_at or 0.0, default=StatsSnapshot())
    totals = {key: sum(s.total(key) for s in snapshots) for key in GLOBAL_COUNTERS}
    totals |= {key: newest.total(key) for key in BACKLOG_GAUGES}
    functions: dict[str, dict[str, int]] = {}
    timestamps: dict[str, dict[str, float]] = {}
    for snapshot in snapshots:
        for name in snapshot.function_names():
            counts = functions.setdefault(name, {})
            for key, value in snapshot.function(name).items():
                counts[key] = counts.get(key, 0) + value
            times = timestamps.setdefault(name, {})
            for key, at in snapshot.last(name).items():
                times[key] = max(at, times.get(key, at))
    stamps = [s.updated_at for s in snapshots if s.updated_at is not None]
    return StatsSnapshot(
        totals=totals,
        functions=functions,
        updated_at=max(stamps) if stamps else None,
        timestamps={k: v for k, v in timestamps.items() if v},
    )
