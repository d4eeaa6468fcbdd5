"""Priority classes with aging (the embedded broker's scheduling rule).

Four classes, ``critical`` (0) to ``low`` (3); an event's class comes from an
optional ``priority`` field beside ``event`` (default ``normal``). Strict
priority would starve ``low`` work under a steady stream of ``critical``
events, so every full minute a job has waited raises its effective class by
one. A claim looks at the oldest ready job of each class only (four indexed
lookups, never a scan of the ready set) and takes the candidate with the best
effective class; ties go to the older job, so a ``low`` job that waited three
minutes wins over a fresh ``critical`` one.

The Redis broker has no priority: a ``priority`` field there is ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, NamedTuple

PRIORITIES: Final = ("critical", "high", "normal", "low")
DEFAULT_PRIORITY: Final = "normal"
AGING_STEP_MS: Final = 60_000  # each full minute waited raises the class by one


class InvalidPriority(ValueError):
    """A ``priority`` value that is not one of :data:`PRIORITIES`."""


def priority_class(name: str | None) -> int:
    """The class number of ``name`` (``None`` or empty: ``normal``)."""
    if name is None or name == "":
        return PRIORITIES.index(DEFAULT_PRIORITY)
    try:
        return PRIORITIES.index(name)
    except ValueError:
        accepted = ", ".join(PRIORITIES)
        raise InvalidPriority(f"priority {name[:40]!r} is not one of {accepted}") from None


class Candidate(NamedTuple):
    """The longest-ready job of one class."""

    priority: int
    ready_ms: int  # when it became ready: its publish, or a delayed job's due time
    seq: int


def effective_class(priority: int, ready_ms: int, now_ms: int) -> int:
    """``priority`` raised one class per full minute waited since the job became
    ready (never above critical): a delayed job ages from its due time."""
    waited = max(0, now_ms - ready_ms)
    return max(0, priority - waited // AGING_STEP_MS)


def choose(candidates: Iterable[Candidate], now_ms: int) -> Candidate | None:
    """The job a claim takes among the per-class candidates: best effective class,
    then the longest ready, then the first added."""
    best: Candidate | None = None
    best_key: tuple[int, int, int] | None = None
    for c in candidates:
        key = (effective_class(c.priority, c.ready_ms, now_ms), c.ready_ms, c.seq)
        if best_key is None or key < best_key:
            best, best_key = c, key
    return best
