"""The ``@class`` codec: what the dispatcher writes is what ``relay trace`` reads."""

from __future__ import annotations

import pytest

from relay.domain import classification as codec
from relay.domain.classification import ClassKind
from relay.domain.schedule import ID_PREFIX


@pytest.mark.parametrize("functions", [("a",), ("a", "b-c"), ("x", "y", "z")])
def test_matched_round_trips(functions: tuple[str, ...]) -> None:
    found = codec.decode(codec.matched(functions))
    assert found.kind is ClassKind.MATCHED
    assert found.functions == functions


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (codec.UNMATCHED, ClassKind.UNMATCHED),
        (codec.WAITING, ClassKind.WAITING),
        (f"{ID_PREFIX}fn/h@2026-01-01T00:00:00Z", ClassKind.OCCURRENCE),
        ("something-newer", ClassKind.OTHER),
    ],
)
def test_every_written_value_has_one_kind(text: str, kind: ClassKind) -> None:
    found = codec.decode(text)
    assert (found.kind, found.text, found.functions) == (kind, text, ())


def test_the_stored_text_is_unchanged() -> None:
    """Ledgers written before the codec existed read the same."""
    assert codec.matched(["a", "b"]) == "matched:a,b"
    assert codec.UNMATCHED == "unmatched"
