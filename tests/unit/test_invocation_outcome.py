"""Message outcome table, payload inspection and DLQ entry format."""

from __future__ import annotations

import pytest

from relay.domain.dlq_event import (
    EVENT_BASE64_MARK,
    dlq_event_bytes,
    dlq_event_text,
    republishable,
)
from relay.domain.invocation import BackingOff, Exhausted, Marker, Ok, Running
from relay.domain.outcome import (
    DLQ_FIELDS,
    Acknowledge,
    DeadLetterEntry,
    DeadLetterFirst,
    KeepPending,
    Malformed,
    MessageOutcome,
    classify_failure,
    inspect_payload,
    malformed,
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
    assert not republishable(result.reason)
    assert result.summary.endswith("... (2008 bytes, truncated)")


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        '{"caf\u00e9": 1'.encode(),
        b"\xff\xfe\x00binary",
        (EVENT_BASE64_MARK + "AAAA").encode(),  # text that looks like the mark is encoded too
        b"",
    ],
)
def test_the_dlq_event_text_gives_back_exactly_the_payload(raw: bytes) -> None:
    text = dlq_event_text(raw)
    assert text.startswith(EVENT_BASE64_MARK) == (text != raw.decode("utf-8", "replace"))
    assert dlq_event_bytes(text) == raw


def test_an_undecodable_payload_within_the_cap_is_kept_whole() -> None:
    nested = b"[" * 1000 + b"]" * 1000 + b"\x00" * 20  # 2,020 bytes
    result = classify_failure(RecursionError(), nested, 256 * 1024)
    assert result.reason == "event could not be decoded or classified: nested too deeply"
    assert dlq_event_bytes(result.summary) == nested
    assert republishable(result.reason)
    not_utf8 = inspect_payload(b"\xff" * 300, 1024)
    assert isinstance(not_utf8, Malformed)
    assert dlq_event_bytes(not_utf8.summary) == b"\xff" * 300
    assert republishable(not_utf8.reason)


def test_only_an_oversized_or_missing_payload_is_summarised() -> None:
    assert malformed("invalid schedule occurrence: x", b"a" * 2000, 1024).summary.endswith(
        "... (2000 bytes, truncated)"
    )
    missing = inspect_payload(None, 1024)
    assert isinstance(missing, Malformed)
    assert not republishable(missing.reason)


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
