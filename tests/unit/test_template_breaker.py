"""The template's ``breaker`` key: off by default, defaults, one line per mistake."""

from __future__ import annotations

from typing import Any

import pytest

from relay.domain.breaker import BreakerPolicy
from relay.domain.durations import MINUTE, SECOND
from relay.domain.errors import TemplateError
from relay.domain.template import parse_template

BASE: dict[str, Any] = {
    "runtime": "python3.14",
    "events": [{"handler": "h.run", "pattern": {"kind": ["x"]}}],
}


def problems(breaker: object) -> list[str]:
    with pytest.raises(TemplateError) as caught:
        parse_template({**BASE, "breaker": breaker})
    return caught.value.problems


def test_the_breaker_is_off_unless_the_template_has_one() -> None:
    assert parse_template(BASE).breaker is None
    assert parse_template({**BASE, "breaker": None}).breaker is None


def test_an_empty_map_takes_every_default() -> None:
    assert parse_template({**BASE, "breaker": {}}).breaker == BreakerPolicy(
        failures=5, window_ns=MINUTE, cooldown_ns=30 * SECOND, max_cooldown_ns=10 * MINUTE
    )


def test_every_setting_is_read() -> None:
    raw = {"failures": 3, "window": "2m", "cooldown": "5s", "max_cooldown": "1m"}
    assert parse_template({**BASE, "breaker": raw}).breaker == BreakerPolicy(
        failures=3, window_ns=2 * MINUTE, cooldown_ns=5 * SECOND, max_cooldown_ns=MINUTE
    )


def test_a_cooldown_longer_than_the_default_cap_raises_the_cap_with_it() -> None:
    policy = parse_template({**BASE, "breaker": {"cooldown": "20m"}}).breaker
    assert policy is not None
    assert policy.max_cooldown_ns == 20 * MINUTE


@pytest.mark.parametrize(
    ("breaker", "expected"),
    [
        (True, "breaker: must be a map such as {failures: 5, window: 1m, cooldown: 30s, "
               "max_cooldown: 10m} (got true)"),
        ([1], "breaker: must be a map such as"),
        ({"failure": 3}, 'breaker.failure: unknown key (did you mean "failures"?'),
        ({"failures": 0}, "breaker.failures: must be an integer from 1 to 1000 (got 0)"),
        ({"failures": "5"}, "breaker.failures: must be an integer from 1 to 1000"),
        ({"failures": True}, "breaker.failures: must be an integer from 1 to 1000"),
        ({"window": 60}, 'breaker.window: must be a Go duration string such as "20s"'),
        ({"window": "1 minute"}, "breaker.window: \"1 minute\" is not a Go duration"),
        ({"cooldown": "-1s"}, "breaker.cooldown:"),
        ({"cooldown": "0s"}, "breaker.cooldown: must be positive"),
        ({"max_cooldown": "25h"}, "breaker.max_cooldown: must be at most 24h"),
        (
            {"cooldown": "1m", "max_cooldown": "30s"},
            "breaker.max_cooldown: must be at least the cooldown (1m) (got 30s)",
        ),
    ],
)
def test_each_invalid_form_is_one_clear_line(breaker: object, expected: str) -> None:
    [line] = problems(breaker)
    assert line.startswith(expected), line
