"""The delivery options' rules (relay.domain.publication), one place for every
producer and both brokers."""

from __future__ import annotations

import pytest

from relay.domain.publication import (
    MAX_DELAY_MS,
    MAX_KEY_LENGTH,
    InvalidPublication,
    Publication,
    check_all,
    check_key,
    delayed_due,
    due_ms,
    key_record,
    parse_time,
)

NOW = 1_800_000_000_000


def test_a_time_not_after_now_is_now_and_a_later_one_is_its_own() -> None:
    assert due_ms(None, NOW) is None
    assert due_ms(NOW, NOW) is None
    assert due_ms(NOW - 1, NOW) is None
    assert due_ms(NOW + 1, NOW) == NOW + 1


def test_the_bound_is_365_days_inclusive() -> None:
    check_all([Publication(b"{}", deliver_at_ms=NOW + MAX_DELAY_MS)], NOW)
    with pytest.raises(InvalidPublication, match="more than 365 days ahead"):
        check_all([Publication(b"{}", deliver_at_ms=NOW + MAX_DELAY_MS + 1)], NOW)


@pytest.mark.parametrize("key", ["a", "order-42", "tenant:7/charge@2026-12-24+x=1_y.z",
                                 "k" * MAX_KEY_LENGTH])
def test_keys_of_the_safe_alphabet_up_to_128_characters_are_accepted(key: str) -> None:
    assert check_key(key) == key


@pytest.mark.parametrize(
    ("key", "why"),
    [("", "0 characters"), ("k" * 129, "129 characters"), ("a b", "other characters"),
     ("naïve", "other characters"), ("a\nb", "other characters"), ("a*", "other characters")],
)
def test_other_keys_are_one_line_naming_why(key: str, why: str) -> None:
    with pytest.raises(InvalidPublication, match=why) as caught:
        check_key(key)
    assert "\n" not in str(caught.value)


def test_rfc3339_times_need_their_zone() -> None:
    assert parse_time("2026-12-24T18:00:00Z") == 1_798_135_200_000
    assert parse_time("2026-12-24T19:00:00+01:00") == 1_798_135_200_000
    assert parse_time("2026-12-24T18:00:00.250Z") == 1_798_135_200_250
    with pytest.raises(InvalidPublication, match="has no zone"):
        parse_time("2026-12-24T18:00:00")
    with pytest.raises(InvalidPublication, match="not an RFC 3339 time"):
        parse_time("next tuesday")


def test_a_delayed_id_names_its_due_time_and_nothing_else_does() -> None:
    assert delayed_due(f"delayed-{NOW}-7") == NOW
    for other in (f"{NOW}-7", "delayed-", f"delayed-{NOW}", "delayed-x-1", f"delayed-{NOW}-x"):
        assert delayed_due(other) is None


def test_a_key_record_is_scoped_by_the_percent_encoded_stream() -> None:
    assert key_record("events", "k") == "relay:publish:events:k"
    assert key_record("a:b*", "k") == "relay:publish:a%3Ab%2A:k"
