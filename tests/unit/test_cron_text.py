"""Human-readable cron descriptions for ``relay function inspect``."""

from __future__ import annotations

import pytest

from relay.domain.cron_text import describe


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
        ("0 6 * * 1,3,5", "At 06:00, only on Monday, Wednesday and Friday"),
        ("0 0 1 * *", "At 00:00, on day 1 of the month"),
        ("0 0 1 1 *", "At 00:00, on day 1 of the month, only in January"),
        ("0 0 * 6-8 *", "At 00:00, June through August"),
        ("* * * * *", "Every minute"),
        ("*/5 * * * *", "Every 5 minutes"),
        ("15 * * * *", "At minute 15 of every hour"),
        ("0 */2 * * *", "At minute 00 of every 2 hours"),
        ("0 0 3 * * *", "At 03:00"),
        ("30 0 3 * * *", "At 03:00:30"),
    ],
)
def test_descriptions(cron: str, text: str) -> None:
    assert describe(cron) == text


@pytest.mark.parametrize(
    "cron",
    ["", "bad", "0-5 * * * *", "0 3 L * *", "0 3 * * 1#2", "*/0 * * * *", "1 2 3", "99 3 * * *"],
)
def test_unknown_forms_give_none_never_raise(cron: str) -> None:
    assert describe(cron) is None
