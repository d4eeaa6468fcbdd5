"""Human-readable cron descriptions (cron-descriptor, 24-hour time)."""

from __future__ import annotations

import pytest

from relay.entrypoints.cli.cron_text import describe


@pytest.mark.parametrize(
    ("cron", "text"),
    [
        ("0 3 * * *", "At 03:00"),
        ("0 8 * * 1-5", "At 08:00, Monday through Friday"),
        ("0 8 * * MON-FRI", "At 08:00, Monday through Friday"),
        ("30 14 * * *", "At 14:30"),
        ("0 9,17 * * *", "At 09:00 and 17:00"),
        ("0 0 * * 0", "At 00:00, only on Sunday"),
        ("0 0 * * 7", "At 00:00, only on Sunday"),
        ("* * * * *", "Every minute"),
        ("*/5 * * * *", "Every 5 minutes"),
        ("0 0 3 * * *", "At 03:00"),  # 6 fields: seconds first
        ("30 0 3 * * *", "At 03:00:30"),
        ("* * * * * *", "Every second"),
        ("*/7 1,2 * * *", "Every 7 minutes, at 01:00 and 02:00"),
    ],
)
def test_descriptions_are_in_24_hour_time(cron: str, text: str) -> None:
    assert describe(cron) == text


@pytest.mark.parametrize("cron", ["", "bad", "a b c d e", "0 0 3 * * * 2026"])
def test_what_cannot_be_described_is_none(cron: str) -> None:
    assert describe(cron) is None
