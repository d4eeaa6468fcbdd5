"""``DLQ_RETENTION``: off by default, validated like every duration, and a pass
deletes exactly what was written before ``now - retention``."""

from __future__ import annotations

import pytest

from relay.application.dlq_retention import DeadLetterRetention
from relay.domain.dlq_selection import parse_time_bound
from relay.domain.durations import HOUR
from relay.domain.errors import ConfigError
from relay.entrypoints.config import load_settings
from tests.fakes import FakeClock

BASE = {"REDIS_URI": "localhost:6379", "REDIS_STREAM": "events", "REDIS_GROUP": "relay"}


def test_dlq_retention_is_off_unless_set() -> None:
    assert load_settings(BASE).dlq_retention_ns is None
    assert load_settings({**BASE, "DLQ_RETENTION": ""}).dlq_retention_ns is None
    assert load_settings({**BASE, "DLQ_RETENTION": "168h"}).dlq_retention_ns == 168 * HOUR


def test_dlq_retention_takes_days_as_dlq_ls_since_does() -> None:
    # one parser for every duration an operator types (relay.domain.durations)
    assert load_settings({**BASE, "DLQ_RETENTION": "7d"}).dlq_retention_ns == 168 * HOUR
    now_ms = 10**13
    assert parse_time_bound("--since", "7d", now_ms=now_ms) == now_ms - 168 * HOUR // 10**6


@pytest.mark.parametrize("value", ["7", "0s", "-1h", "7 days", "1w", "forever"])
def test_a_bad_dlq_retention_is_one_line_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({**BASE, "DLQ_RETENTION": value})
    message = str(caught.value)
    assert message == f"DLQ_RETENTION={value!r} is invalid: a positive duration such as 168h or 7d"


class InMemoryDeadLetters:
    """Entries by written-at millisecond; ``trim_before`` as both brokers do it."""

    key = "relay:events:dlq"

    def __init__(self, written_ms: list[int]) -> None:
        self.written_ms = written_ms
        self.cutoffs: list[int] = []

    async def trim_before(self, cutoff_ms: int) -> int:
        self.cutoffs.append(cutoff_ms)
        kept = [ms for ms in self.written_ms if ms >= cutoff_ms]
        removed = len(self.written_ms) - len(kept)
        self.written_ms = kept
        return removed


@pytest.mark.anyio
async def test_a_pass_deletes_only_entries_older_than_the_window() -> None:
    clock = FakeClock(now=1_800_000_000.0)
    now_ms = 1_800_000_000_000
    hour_ms = 3_600_000
    dead = InMemoryDeadLetters(
        [now_ms - 3 * hour_ms, now_ms - hour_ms - 1, now_ms - hour_ms, now_ms]
    )
    keeper = DeadLetterRetention(dead, HOUR, clock)
    assert await keeper.trim_once() == 2
    assert dead.cutoffs == [now_ms - hour_ms]
    assert dead.written_ms == [now_ms - hour_ms, now_ms]
    assert await keeper.trim_once() == 0


def test_retention_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        DeadLetterRetention(InMemoryDeadLetters([]), 0, FakeClock())
