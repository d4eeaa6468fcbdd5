"""Retention cutoff arithmetic: the trim never passes what a group still needs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relay.domain.durations import parse_duration
from relay.domain.retention import (
    MAX_SEQUENCE,
    GroupPosition,
    StreamId,
    safe_cutoff,
    trim_interval_ns,
    window_cutoff,
)


def sid(text: str) -> StreamId:
    return StreamId.parse(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-0", StreamId(0, 0)),
        ("1700000000000-5", StreamId(1_700_000_000_000, 5)),
        ("42", StreamId(42, 0)),
        (b"7-1", StreamId(7, 1)),
        (f"1-{MAX_SEQUENCE}", StreamId(1, MAX_SEQUENCE)),
    ],
)
def test_parse_stream_id(text: str | bytes, expected: StreamId) -> None:
    assert StreamId.parse(text) == expected


@pytest.mark.parametrize(
    "text", ["", "-", "a-1", "1-", "1-x", "-1", "1-2-3", f"1-{MAX_SEQUENCE + 1}"]
)
def test_parse_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="stream id"):
        StreamId.parse(text)


def test_ids_order_numerically_not_lexically() -> None:
    assert sid("9-0") < sid("10-0")
    assert sid("5-9") < sid("5-10")
    assert str(sid("5-10")) == "5-10"


@pytest.mark.parametrize(
    ("current", "after"),
    [("5-0", "5-1"), ("0-0", "0-1"), (f"5-{MAX_SEQUENCE}", "6-0")],
)
def test_successor(current: str, after: str) -> None:
    assert sid(current).successor() == sid(after)


def test_window_cutoff_is_now_minus_retention_in_ms() -> None:
    assert window_cutoff(10_000_000, parse_duration("1h")) == StreamId(10_000_000 - 3_600_000, 0)
    assert window_cutoff(1_000, parse_duration("1h")) == StreamId(0, 0)


WINDOW = sid("1000-0")


@pytest.mark.parametrize(
    ("groups", "effective", "limited_by"),
    [
        # no groups: the window decides
        ([], "1000-0", None),
        # a group that has read everything and has nothing pending
        ([GroupPosition("g", sid("5000-3"), None)], "1000-0", None),
        # an old pending entry holds the cutoff at itself (it survives: MINID keeps >= cutoff)
        ([GroupPosition("g", sid("5000-0"), sid("400-2"))], "400-2", "g"),
        # pending entry inside the window: no effect
        ([GroupPosition("g", sid("5000-0"), sid("1500-0"))], "1000-0", None),
        # a group that is behind: entries after its last-delivered id are not yet delivered
        ([GroupPosition("slow", sid("700-4"), None)], "700-5", "slow"),
        # a brand-new group at 0 keeps the whole stream
        ([GroupPosition("new", sid("0-0"), None)], "0-1", "new"),
        # several groups: the most restrictive wins
        (
            [
                GroupPosition("a", sid("900-0"), sid("800-0")),
                GroupPosition("b", sid("300-0"), None),
                GroupPosition("c", sid("5000-0"), sid("600-0")),
            ],
            "300-1",
            "b",
        ),
        # pending older than last-delivered+1 inside one group
        ([GroupPosition("g", sid("950-0"), sid("10-7"))], "10-7", "g"),
        # last-delivered at the window: the window is already safe
        ([GroupPosition("g", sid("1000-0"), None)], "1000-0", None),
        # last-delivered just below the window: its successor is the bound
        ([GroupPosition("g", sid("999-99"), None)], "999-100", "g"),
        # sequence overflow rolls into the next millisecond
        ([GroupPosition("g", sid(f"999-{MAX_SEQUENCE}"), None)], "1000-0", None),
    ],
)
def test_safe_cutoff_clamps_to_every_group(
    groups: list[GroupPosition], effective: str, limited_by: str | None
) -> None:
    cutoff = safe_cutoff(WINDOW, groups)
    assert cutoff.window == WINDOW
    assert cutoff.effective == sid(effective)
    assert cutoff.limited_by == limited_by


def test_safe_cutoff_never_exceeds_the_window() -> None:
    cutoff = safe_cutoff(WINDOW, [GroupPosition("g", sid("99999-0"), sid("50000-0"))])
    assert cutoff.effective == WINDOW


@pytest.mark.parametrize(
    ("retention", "interval"),
    [
        ("6h", "15m"),
        ("1h", "2m30s"),
        ("20m", "1m"),
        ("10m", "1m"),
        ("24h", "1h"),
        ("168h", "1h"),
        ("2h", "5m"),
    ],
)
def test_trim_interval(retention: str, interval: str) -> None:
    assert trim_interval_ns(parse_duration(retention)) == parse_duration(interval)


_ids = st.builds(StreamId, st.integers(0, 10_000), st.integers(0, MAX_SEQUENCE))
_groups = st.lists(
    st.builds(GroupPosition, st.text(min_size=1, max_size=4), _ids, st.none() | _ids),
    max_size=5,
)


@given(window=_ids, groups=_groups)
def test_the_cutoff_never_passes_anything_a_group_still_needs(
    window: StreamId, groups: list[GroupPosition]
) -> None:
    cutoff = safe_cutoff(window, groups)
    assert cutoff.effective <= window
    for group in groups:
        # MINID keeps ids >= cutoff: every pending and every undelivered id survives
        if group.oldest_pending is not None:
            assert cutoff.effective <= group.oldest_pending
        assert cutoff.effective <= group.last_delivered.successor()
    bounds = [window] + [
        min(g.last_delivered.successor(), g.oldest_pending or g.last_delivered.successor())
        for g in groups
    ]
    assert cutoff.effective == min(bounds)  # and it trims as much as is safe
