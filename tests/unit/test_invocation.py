"""Invocation markers and their state machine: encoding, decisions, fenced transitions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.domain.invocation import (
    BackingOff,
    Claim,
    Complete,
    Done,
    Exhaust,
    Exhausted,
    ExhaustNow,
    Marker,
    Ok,
    Release,
    Retry,
    Running,
    Skip,
    Terminal,
    after_failure,
    apply_transition,
    backoff_ms,
    decide,
    format_marker,
    invocation_field,
    parse_marker,
)

NOW = 1_800_000_000_000


@pytest.mark.parametrize(
    ("text", "marker"),
    [
        ("ok", Ok()),
        ("running:1800000005000#1#abc", Running(1_800_000_005_000, 1, "abc")),
        ("next_attempt_at:1800000060000#2", BackingOff(1_800_000_060_000, 2)),
        ("exhausted:5", Exhausted(5)),
        ("exhausted:5:dlq", Exhausted(5, dead_lettered=True)),
    ],
)
def test_markers_parse_and_format(text: str, marker: Marker) -> None:
    assert parse_marker(text) == marker
    assert format_marker(marker) == text


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "running:1800000005000",  # the spec: no #attempt does not parse
        "running:1800000005000#1",  # no token: not a fenced claim
        "running:1800000005000#0#tok",  # attempts are 1-based
        "running:-5#1#tok",
        "next_attempt_at:abc#1",
        "next_attempt_at:1#2#extra",
        "exhausted:",
        "exhausted:3:other",
        "OK",
        "garbage",
    ],
)
def test_unparsable_markers_are_absent(text: str | None) -> None:
    assert parse_marker(text) is None
    assert decide(parse_marker(text), NOW, 5) == Claim(1)


markers = st.one_of(
    st.just(Ok()),
    st.builds(
        Running,
        st.integers(0, 10**13),
        st.integers(1, 100),
        st.text("abcdef0123456789", min_size=1, max_size=16),
    ),
    st.builds(BackingOff, st.integers(0, 10**13), st.integers(1, 100)),
    st.builds(Exhausted, st.integers(0, 100), st.booleans()),
)


@given(markers)
def test_every_marker_round_trips(marker: Marker) -> None:
    assert parse_marker(format_marker(marker)) == marker


@pytest.mark.parametrize(
    ("marker", "max_attempts", "decision"),
    [
        (None, 5, Claim(1)),
        (Ok(), 5, Done()),
        (Exhausted(5), 5, Terminal(5, False)),
        (Exhausted(5, True), 5, Terminal(5, True)),
        # protected exactly while now < deadline
        (Running(NOW + 1, 1, "t"), 5, Skip(NOW + 1, running=True)),
        (Running(NOW, 1, "t"), 5, Claim(2)),
        (BackingOff(NOW + 1, 2), 5, Skip(NOW + 1, running=False)),
        (BackingOff(NOW, 2), 5, Claim(3)),
        # an expired claim counts as a spent attempt
        (Running(NOW - 1, 5, "t"), 5, ExhaustNow(5)),
        (BackingOff(NOW - 1, 4), 5, Claim(5)),
        # retries lowered in the template after attempts were spent
        (BackingOff(NOW - 1, 4), 2, ExhaustNow(4)),
        (Running(NOW - 1, 1, "t"), 1, ExhaustNow(1)),
        (None, 1, Claim(1)),
    ],
)
def test_decide(marker: Marker | None, max_attempts: int, decision: object) -> None:
    assert decide(marker, NOW, max_attempts) == decision


def test_backoff_is_1m_2m_5m_then_10m() -> None:
    assert [backoff_ms(a) for a in range(1, 8)] == [
        60_000,
        120_000,
        300_000,
        600_000,
        600_000,
        600_000,
        600_000,
    ]


def test_failures_retry_until_one_plus_retries_attempts() -> None:
    retries = 4
    transitions = [after_failure(a, 1 + retries) for a in range(1, 6)]
    assert transitions == [Retry(60_000), Retry(120_000), Retry(300_000), Retry(600_000), Exhaust()]
    assert after_failure(1, 1) == Exhaust()


@pytest.mark.parametrize(
    ("transition", "after"),
    [
        (Complete(), Ok()),
        (Retry(60_000), BackingOff(NOW + 60_000, 2)),
        (Exhaust(), Exhausted(2)),
        (Release(""), None),
        (Release("next_attempt_at:5#1"), BackingOff(5, 1)),
    ],
)
def test_the_claim_holder_moves_the_marker(transition: object, after: Marker | None) -> None:
    current = Running(NOW + 1000, 2, "mine")
    assert apply_transition(current, "mine", 2, transition, NOW) == (after, True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("current", "token", "attempt"),
    [
        (Running(NOW + 1000, 3, "newer"), "mine", 2),  # taken over by a newer attempt
        (Running(NOW + 1000, 2, "newer"), "mine", 2),  # same attempt number, other token
        (Running(NOW + 1000, 3, "mine"), "mine", 2),  # stale attempt number
        (Ok(), "mine", 2),
        (Exhausted(2), "mine", 2),
        (BackingOff(NOW, 2), "mine", 2),
        (None, "mine", 2),
    ],
)
def test_a_stale_claim_is_rejected(current: Marker | None, token: str, attempt: int) -> None:
    for transition in (Complete(), Retry(1), Exhaust(), Release("")):
        assert apply_transition(current, token, attempt, transition, NOW) == (current, False)


def test_invocation_identity_is_function_slash_handler() -> None:
    assert invocation_field("user-events", "events.created.handler") == (
        "user-events/events.created.handler"
    )
