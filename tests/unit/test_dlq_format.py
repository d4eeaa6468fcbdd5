"""How ``relay dlq`` renders entries: ages and the inspect text."""

from __future__ import annotations

import pytest

from relay.domain.dead_letters import InvalidEntryId, StoredDeadLetter, parse_entry_id
from relay.entrypoints.cli.dlq import describe, relative_age

FIELDS = {
    b"original_stream": b"events",
    b"original_id": b"1-0",
    b"group": b"relay",
    b"consumer": b"w1",
    b"event": b'{"b": 1, "a": [1]}',
    b"reason": b"boom",
    b"function": b"users",
    b"handler": b"events.created.handler",
    b"deliveries": b"6",
    b"handler_attempts": b"5",
    b"timestamp": b"2026-01-01T00:00:00.000Z",
}
WRITTEN = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s ago"),
        (-5, "0s ago"),
        (59, "59s ago"),
        (60, "1m ago"),
        (3599, "59m ago"),
        (7200, "2h ago"),
        (5 * 86400, "5d ago"),
    ],
)
def test_relative_age(seconds: float, text: str) -> None:
    assert relative_age(seconds) == text


def test_old_ages_become_a_date() -> None:
    assert relative_age(400 * 86400)[:2] == "20"


def test_entries_parse_from_a_raw_reply() -> None:
    stored = StoredDeadLetter.from_reply(b"1767225600000-3", FIELDS)
    assert stored.id == "1767225600000-3"
    assert stored.entry.handler_attempts == 5
    assert stored.replayable
    assert stored.created_ms == 1_767_225_600_000


def test_placeholder_entries_are_not_replayable() -> None:
    stored = StoredDeadLetter.from_reply("1-0", {**FIELDS, b"function": b"-", b"handler": b"-"})
    assert not stored.replayable


def test_inspect_text_pretty_prints_the_event_in_its_own_key_order() -> None:
    stored = StoredDeadLetter.from_reply("1767225600000-0", FIELDS)
    lines = describe(stored, now=WRITTEN + 120)
    assert "Dead-lettered:     2026-01-01T00:00:00.000Z (2m ago)" in lines
    assert lines[-2:] == ["Event:", '{\n  "b": 1,\n  "a": [\n    1\n  ]\n}']


@pytest.mark.parametrize("payload", [b"[1, 2]", b"not json", b"", b'"text"'])
def test_inspect_text_shows_a_non_object_verbatim(payload: bytes) -> None:
    stored = StoredDeadLetter.from_reply("1-0", {**FIELDS, b"event": payload})
    lines = describe(stored, now=WRITTEN)
    assert lines[-2:] == ["Event (not a JSON object; shown verbatim):", payload.decode()]


@pytest.mark.parametrize(("text", "normalised"), [("5-1", "5-1"), (" 7 ", "7-0")])
def test_entry_ids_are_normalised(text: str, normalised: str) -> None:
    assert parse_entry_id(text) == normalised


@pytest.mark.parametrize("text", ["", "abc", "1-x", "-"])
def test_bad_entry_ids_are_one_clear_error(text: str) -> None:
    with pytest.raises(InvalidEntryId, match="relay dlq ls"):
        parse_entry_id(text)
