"""Message outcome table, payload inspection and DLQ entry format."""

from __future__ import annotations

import pytest

from relay.domain.invocation import BackingOff, Exhausted, Marker, Ok, Running
from relay.domain.outcome import (
    DLQ_FIELDS,
    Acknowledge,
    DeadLetterEntry,
    DeadLetterFirst,
    KeepPending,
    Malformed,
    MessageOutcome,
    inspect_payload,
    message_outcome,
    rfc3339,
)


@pytest.mark.parametrize(
    ("gates", "blocked", "outcome"),
    [
        ({}, False, Acknowledge()),  # unmatched
        ({}, True, KeepPending()),
        ({"a/h": Ok(), "b/h": Ok()}, False, Acknowledge()),
        ({"a/h": Ok(), "b/h": Ok()}, True, KeepPending()),  # another function still building
        ({"a/h": Ok(), "b/h": BackingOff(1, 1)}, False, KeepPending()),
        ({"a/h": Ok(), "b/h": Running(1, 1, "t")}, False, KeepPending()),
        ({"a/h": Ok(), "b/h": None}, False, KeepPending()),
        ({"a/h": Ok(), "b/h": Exhausted(5)}, False, DeadLetterFirst(("b/h",))),
        ({"a/h": Exhausted(2), "b/h": Exhausted(5)}, False, DeadLetterFirst(("a/h", "b/h"))),
        ({"a/h": Exhausted(2, True), "b/h": Exhausted(5)}, False, DeadLetterFirst(("b/h",))),
        ({"a/h": Exhausted(2, True), "b/h": Ok()}, False, Acknowledge()),
        ({"a/h": Exhausted(2), "b/h": BackingOff(1, 1)}, False, KeepPending()),
    ],
)
def test_message_outcome(
    gates: dict[str, Marker | None], blocked: bool, outcome: MessageOutcome
) -> None:
    assert message_outcome(gates, blocked=blocked) == outcome


def test_payload_object_is_decoded() -> None:
    assert inspect_payload(b'{"a": 1}', 100) == {"a": 1}


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "missing event field"),
        (b"\xff\xfe", "not a UTF-8 string"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON list, not an object"),
        (b'"text"', "JSON str, not an object"),
        (b"42", "JSON int, not an object"),
        (b"null", "JSON NoneType, not an object"),
    ],
)
def test_malformed_payloads(raw: bytes | None, reason: str) -> None:
    result = inspect_payload(raw, 1024)
    assert isinstance(result, Malformed)
    assert reason in result.reason


def test_the_size_cap_is_checked_before_decoding() -> None:
    raw = b'{"a": "' + b"x" * 2000 + b'"'  # not even valid JSON: never parsed
    result = inspect_payload(raw, 1024)
    assert isinstance(result, Malformed)
    assert "larger than MAX_EVENT_BYTES (1024)" in result.reason
    assert len(result.summary) < 400
    assert inspect_payload(b'{"a": "' + b"x" * 1000 + b'"}', 1024) == {"a": "x" * 1000}


def test_dlq_entry_fields_are_the_spec_flat_format() -> None:
    entry = DeadLetterEntry(
        original_stream="events",
        original_id="1-0",
        group="relay",
        consumer="host",
        event='{"a":1}',
        reason="boom",
        function="fn",
        handler="h.x",
        deliveries=3,
        handler_attempts=2,
        timestamp=rfc3339(1_800_000_000.5),
    )
    fields = entry.fields()
    assert tuple(fields) == DLQ_FIELDS
    assert fields["deliveries"] == "3"
    assert fields["timestamp"] == "2027-01-15T08:00:00.500Z"
    assert DeadLetterEntry.from_fields(fields) == entry
