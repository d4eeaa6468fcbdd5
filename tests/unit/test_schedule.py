"""Occurrence identity, the envelope, and when a cron fires (DST included)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from relay.domain import schedule
from relay.domain.errors import TemplateError
from relay.domain.schedule import Envelope, InvalidOccurrence
from relay.domain.template import ScheduleRule, parse_template


def at(year: int, month: int, day: int, hour: int, minute: int, second: int = 0) -> int:
    return int(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp())


def rule(cron: str, zone: str = "UTC", **extra: Any) -> ScheduleRule:
    spec = {"handler": "jobs.run.handler", "cron": cron, "timezone": zone, **extra}
    return parse_template({"runtime": "python3.14", "schedules": [spec]}).schedules[0]


def wall(r: ScheduleRule, instants: list[int]) -> list[str]:
    return [schedule.local_time(r, t) for t in instants]


def test_identity_is_the_utc_instant_in_whole_seconds() -> None:
    t = at(2026, 3, 29, 1, 0, 0)
    assert schedule.occurrence_id("fn", "jobs.a", t) == "schedule:fn:jobs.a:2026-03-29T01:00:00Z"
    assert schedule.dedup_key("prod", "schedule:fn:jobs.a:2026-03-29T01:00:00Z") == (
        "relay:occurrence:prod:schedule:fn:jobs.a:2026-03-29T01:00:00Z"
    )
    # the stream is encoded: its colons and glob characters never shape the key
    assert schedule.dedup_key("a:b*", "schedule:fn:h:2026-03-29T01:00:00Z") == (
        "relay:occurrence:a%3Ab%2A:schedule:fn:h:2026-03-29T01:00:00Z"
    )
    assert schedule.legacy_dedup_key("schedule:fn:jobs.a:2026-03-29T01:00:00Z") == (
        "relay:schedule:fn:jobs.a:2026-03-29T01:00:00Z"
    )


def test_envelope_and_handler_payload_bytes() -> None:
    occurrence = schedule.envelope("fn", "jobs.a", at(2026, 3, 29, 1, 0, 0))
    assert schedule.encode(occurrence) == (
        b'{"source":"relay.schedule","function":"fn","handler":"jobs.a",'
        b'"scheduled_at":"2026-03-29T01:00:00Z","occurrence_id":"schedule:fn:jobs.a:'
        b'2026-03-29T01:00:00Z"}'
    )
    assert schedule.handler_payload(occurrence) == (
        b'{"source":"relay.schedule","scheduled_at":"2026-03-29T01:00:00Z"}'
    )


def test_an_encoded_envelope_parses_back() -> None:
    occurrence = schedule.envelope("fn", "jobs.a", at(2026, 3, 29, 1, 0, 0))
    decoded = msgspec.json.decode(schedule.encode(occurrence))
    assert schedule.is_occurrence(decoded)
    assert schedule.parse_occurrence(decoded) == occurrence


def _good() -> dict[str, Any]:
    return msgspec.to_builtins(schedule.envelope("fn", "jobs.a", at(2026, 3, 29, 1, 0, 0)))  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"function": None}, "function is missing"),
        ({"handler": 3}, "handler is missing"),
        ({"scheduled_at": "2026-03-29T03:00:00+02:00"}, "not an RFC 3339 UTC instant"),
        ({"scheduled_at": "2026-03-29T01:00:00.5Z"}, "not an RFC 3339 UTC instant"),
        ({"scheduled_at": "2026-02-30T01:00:00Z"}, "not an RFC 3339 UTC instant"),
        ({"scheduled_at": "2026-03-29T01:01:00Z"}, "does not match its fields"),
        ({"occurrence_id": "schedule:other:jobs.a:2026-03-29T01:00:00Z"}, "does not match"),
        ({"extra": 1}, "unexpected field extra"),
    ],
)
def test_an_envelope_relay_did_not_write_is_invalid(change: dict[str, Any], reason: str) -> None:
    event = {**_good(), **change}
    event = {k: v for k, v in event.items() if v is not None}
    parsed = schedule.parse_occurrence(event)
    assert isinstance(parsed, InvalidOccurrence)
    assert reason in parsed.reason
    assert parsed.reason.startswith("invalid schedule occurrence: ")


def test_five_and_six_field_forms() -> None:
    minute = rule("*/20 * * * *")
    assert schedule.firings(minute, at(2026, 1, 1, 0, 0), at(2026, 1, 1, 1, 0)) == [
        at(2026, 1, 1, 0, 20), at(2026, 1, 1, 0, 40), at(2026, 1, 1, 1, 0),
    ]  # fmt: skip
    seconds = rule("*/15 * * * * *")  # seconds first
    assert schedule.firings(seconds, at(2026, 1, 1, 0, 0), at(2026, 1, 1, 0, 1)) == [
        at(2026, 1, 1, 0, 0, 15), at(2026, 1, 1, 0, 0, 30), at(2026, 1, 1, 0, 0, 45),
        at(2026, 1, 1, 0, 1, 0),
    ]  # fmt: skip


def test_the_zone_moves_the_firing_not_the_identity() -> None:
    r = rule("0 8 * * *", "Europe/Rome")
    [t] = schedule.firings(r, at(2026, 7, 1, 0, 0), at(2026, 7, 1, 23, 0))
    assert t == at(2026, 7, 1, 6, 0)  # 08:00 CEST
    assert schedule.instant(t) == "2026-07-01T06:00:00Z"


# --- DST on Europe/Rome: 2026-03-29 02:00 -> 03:00, 2026-10-25 03:00 -> 02:00 --------


def test_spring_forward_a_skipped_time_fires_once_after_the_gap() -> None:
    daily = rule("30 2 * * *", "Europe/Rome")
    found = schedule.firings(daily, at(2026, 3, 28, 0, 0), at(2026, 3, 30, 12, 0))
    assert wall(daily, found) == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 02:30 does not exist that day
        "2026-03-30T02:30:00+02:00",
    ]
    half_hourly = rule("*/30 * * * *", "Europe/Rome")
    found = schedule.firings(half_hourly, at(2026, 3, 29, 0, 0), at(2026, 3, 29, 2, 0))
    assert wall(half_hourly, found) == [
        "2026-03-29T01:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # the gap's 02:00 and 02:30 never happen
        "2026-03-29T03:30:00+02:00",
        "2026-03-29T04:00:00+02:00",
    ]


def test_fall_back_a_repeated_time_fires_once_per_instant() -> None:
    daily = rule("30 2 * * *", "Europe/Rome")
    found = schedule.firings(daily, at(2026, 10, 24, 12, 0), at(2026, 10, 26, 0, 0))
    assert [schedule.instant(t) for t in found] == [
        "2026-10-25T00:30:00Z",  # 02:30 CEST
        "2026-10-25T01:30:00Z",  # 02:30 CET: another instant, another occurrence
    ]
    ids = {schedule.occurrence_id("fn", daily.handler, t) for t in found}
    assert len(ids) == 2


@pytest.mark.parametrize(
    ("cron", "start", "end"),
    [
        ("30 2 * * *", at(2026, 3, 28, 0, 0), at(2026, 3, 30, 0, 0)),
        ("*/30 * * * *", at(2026, 3, 29, 0, 0), at(2026, 3, 29, 3, 0)),
        ("30 2 * * *", at(2026, 10, 24, 0, 0), at(2026, 10, 26, 0, 0)),
        ("*/30 * * * *", at(2026, 10, 24, 23, 0), at(2026, 10, 25, 3, 0)),
        ("0 */20 * * * *", at(2026, 10, 24, 23, 0), at(2026, 10, 25, 3, 0)),
    ],
)
def test_is_firing_accepts_exactly_what_firings_publishes(cron: str, start: int, end: int) -> None:
    r = rule(cron, "Europe/Rome")
    published = set(schedule.firings(r, start, end))
    # every cron here fires on whole minutes: ask about every minute of the window
    accepted = {t for t in range(start + 60, end + 1, 60) if schedule.is_firing(r, t)}
    assert published
    assert accepted == published


def test_latest_firing_is_never_in_the_future_and_within_the_window() -> None:
    r = rule("0 3 * * *", "Europe/Rome")
    now = at(2026, 10, 25, 12, 0)
    assert schedule.latest_firing(r, now, 86400) == at(2026, 10, 25, 2, 0)  # 03:00 CET
    assert schedule.latest_firing(r, at(2026, 10, 25, 1, 59), 3600) is None
    assert schedule.latest_firing(r, now, 0) is None
    every_second = rule("* * * * * *")
    assert schedule.latest_firing(every_second, now, 86400) == now


def test_catchup_and_overlap_are_validated() -> None:
    r = rule("0 3 * * *", catchup="2h", overlap="skip")
    assert (r.catchup_ns, r.overlap) == (2 * 3600 * 10**9, "skip")
    assert (rule("0 3 * * *").catchup_ns, rule("0 3 * * *").overlap) == (0, "allow")
    assert rule("0 3 * * *", catchup="0").catchup_ns == 0
    with pytest.raises(TemplateError) as err:
        rule("0 3 * * *", catchup="25h", overlap="queue")
    assert err.value.problems == [
        'schedules[0].catchup: must be at most 24h (got "25h")',
        'schedules[0].overlap: must be allow or skip (got "queue")',
    ]


def test_envelope_field_order_is_the_wire_order() -> None:
    assert Envelope.__struct_fields__ == (
        "source", "function", "handler", "scheduled_at", "occurrence_id",
    )  # fmt: skip


def test_the_occurrence_id_of_a_stream_payload_is_read_only_from_a_valid_envelope() -> None:
    written = schedule.envelope("nightly", "report.main", 1_700_000_000)
    payload = schedule.encode(written)
    assert schedule.occurrence_id_in(payload) == written.occurrence_id
    assert schedule.occurrence_id_in(payload.decode()) == written.occurrence_id
    forged = msgspec.json.decode(payload)
    forged["occurrence_id"] = forged["occurrence_id"] + "0"
    for payload_of_another_kind in (
        None,
        b"{not json",
        b"[1, 2]",
        b'{"event_name": "INSERT"}',
        msgspec.json.encode(forged),  # an id that does not re-derive from its fields
    ):
        assert schedule.occurrence_id_in(payload_of_another_kind) is None
