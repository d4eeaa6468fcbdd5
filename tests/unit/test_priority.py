"""Priority classes with aging: the embedded broker's scheduling rule (pure)."""

from __future__ import annotations

import pytest

from relay.domain.priority import (
    AGING_STEP_MS,
    Candidate,
    InvalidPriority,
    choose,
    effective_class,
    priority_class,
)

NOW = 1_800_000_000_000
CRITICAL, HIGH, NORMAL, LOW = 0, 1, 2, 3


def test_classes_and_the_default() -> None:
    assert [priority_class(p) for p in ("critical", "high", "normal", "low")] == [0, 1, 2, 3]
    assert priority_class(None) == priority_class("") == NORMAL
    with pytest.raises(InvalidPriority, match="not one of critical, high, normal, low"):
        priority_class("urgent")


def test_each_full_minute_waited_raises_the_class_by_one() -> None:
    assert effective_class(LOW, NOW, NOW) == LOW
    assert effective_class(LOW, NOW - AGING_STEP_MS + 1, NOW) == LOW
    assert effective_class(LOW, NOW - AGING_STEP_MS, NOW) == NORMAL
    assert effective_class(LOW, NOW - 10 * AGING_STEP_MS, NOW) == CRITICAL  # never above


def test_a_low_job_waiting_three_minutes_beats_a_fresh_critical_one() -> None:
    low = Candidate(LOW, NOW - 3 * AGING_STEP_MS, 1)
    critical = Candidate(CRITICAL, NOW, 2)
    assert choose([critical, low], NOW) == low


def test_without_aging_the_better_class_wins() -> None:
    low = Candidate(LOW, NOW - 2 * AGING_STEP_MS, 1)  # aged to high only
    critical = Candidate(CRITICAL, NOW, 2)
    high = Candidate(HIGH, NOW - 1000, 3)
    assert choose([low, high, critical], NOW) == critical
    assert choose([low, high], NOW) == low  # equal class after aging: the older one
    assert choose([], NOW) is None
