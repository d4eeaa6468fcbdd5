"""One duration syntax for what an operator types: every duration environment
variable and flag reads :func:`parse_setting_duration` (Go's syntax plus ``d``);
template timeouts and ``now()`` offsets stay exactly Go's."""

from __future__ import annotations

import pytest

from relay.domain.dlq_selection import parse_time_bound
from relay.domain.durations import (
    DAY,
    HOUR,
    MINUTE,
    DurationError,
    parse_duration,
    parse_setting_duration,
)
from relay.entrypoints.cli.fn_match import parse_since
from relay.entrypoints.config import load_settings

BASE = {"REDIS_URI": "localhost:6379", "REDIS_STREAM": "events", "REDIS_GROUP": "relay"}


@pytest.mark.parametrize(
    ("text", "ns"),
    [("7d", 7 * DAY), ("1d12h", DAY + 12 * HOUR), ("1.5d", 36 * HOUR), ("90m", 90 * MINUTE),
     ("168h", 7 * DAY)],
)  # fmt: skip
def test_a_setting_duration_is_gos_syntax_plus_days(text: str, ns: int) -> None:
    assert parse_setting_duration(text) == ns


@pytest.mark.parametrize("text", ["7", "d", "7 d", "1w", "7days", "", "1d-"])
def test_a_setting_duration_refuses_what_is_not_one(text: str) -> None:
    with pytest.raises(DurationError):
        parse_setting_duration(text)


def test_gos_own_syntax_has_no_days() -> None:
    # template timeouts and now() offsets are the spec's Go durations
    with pytest.raises(DurationError):
        parse_duration("7d")


@pytest.mark.parametrize("text", ["7d", "36h", "1d12h", "90m"])
def test_every_flag_and_variable_reads_the_same_text_alike(text: str) -> None:
    ns = parse_setting_duration(text)
    now_ms = 10**13
    env = {**BASE, "DLQ_RETENTION": text, "REDIS_STREAM_RETENTION": text,
           "WARM_CONTAINER_IDLE_TIMEOUT": text, "LEDGER_RETENTION": text}  # fmt: skip
    settings = load_settings(env)
    assert settings.dlq_retention_ns == settings.stream_retention_ns == ns
    assert settings.warm_idle_timeout_ns == settings.ledger_retention_ns == ns
    assert parse_time_bound("--since", text, now_ms=now_ms) == now_ms - ns // 10**6
    assert parse_since(text) == ns // 10**6
