"""The --event / --file / stdin rules shared by ``function match`` and ``function invoke``."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from typer._click.exceptions import UsageError

from relay.domain.errors import EventError
from relay.entrypoints.cli.event_input import MAX_EVENT_INPUT_BYTES, read_event_argument


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def read(event: str | None = None, file: Path | None = None, stdin: str = "") -> object:
    return read_event_argument(event, file, io.StringIO(stdin))


def test_inline_file_and_stdin(tmp_path: Path) -> None:
    assert read('{"a": 1}') == {"a": 1}
    path = tmp_path / "event.json"
    path.write_text('{"b": [1, 2]}')
    assert read(file=path) == {"b": [1, 2]}
    assert read(stdin='  {"c": null}\n') == {"c": None}


def test_flags_are_exclusive(tmp_path: Path) -> None:
    # a usage error, not an EventError: every command exits 2 on it (row 276)
    with pytest.raises(UsageError, match="mutually exclusive"):
        read("{}", tmp_path / "x.json")


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("[1]", "an array"),
        ("null", "null"),
        ("3", "a number"),
        ('"x"', "a string"),
        ("true", "a boolean"),
    ],
)
def test_only_objects_are_events(text: str, kind: str) -> None:
    with pytest.raises(EventError, match=f"event must be a JSON object, not {kind}"):
        read(text)


@pytest.mark.parametrize("text", ["{", "{'a': 1}", "", "   ", '{"a": NaN}', '{"a": Infinity}'])
def test_invalid_json_is_one_line(text: str) -> None:
    with pytest.raises(EventError) as caught:
        read(stdin=text)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("stdin: event is")


def test_interactive_terminal_fails_fast() -> None:
    with pytest.raises(EventError, match="no event given"):
        read_event_argument(None, None, Terminal())


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(EventError, match="cannot read the event file"):
        read(file=tmp_path / "missing.json")


def test_size_cap() -> None:
    with pytest.raises(EventError, match="larger than"):
        read(stdin='{"a": "' + "x" * MAX_EVENT_INPUT_BYTES + '"}')
