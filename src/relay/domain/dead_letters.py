"""A dead-letter entry as either broker stores it, and the ids operators type.

Shared by the dead-letter store adapters (Redis stream, the embedded broker's
table), their fakes and the CLI that renders entries; the port that reads and
removes them is ``DeadLetterStore`` in :mod:`relay.application.ports`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from relay.domain.errors import RelayError
from relay.domain.outcome import PLACEHOLDER, DeadLetterEntry
from relay.domain.retention import StreamId


class DeadLetterNotFound(RelayError):
    """No dead-letter entry has the given id."""


class InvalidEntryId(RelayError):
    """The given text is not a stream entry id."""


@dataclass(frozen=True, slots=True)
class StoredDeadLetter:
    """One dead-letter entry as stored: its stream id and its flat fields."""

    id: str
    entry: DeadLetterEntry

    @classmethod
    def from_reply(cls, entry_id: str | bytes, fields: Mapping[Any, Any]) -> StoredDeadLetter:
        values = {_text(k): _text(v) for k, v in fields.items()}
        return cls(_text(entry_id), DeadLetterEntry.from_fields(values))

    @property
    def replayable(self) -> bool:
        """Placeholder entries (malformed messages) name no handler to re-run."""
        e = self.entry
        return bool(e.function and e.handler) and PLACEHOLDER not in (e.function, e.handler)

    @property
    def created_ms(self) -> int:
        """When the entry was written: the millisecond part of its id."""
        return StreamId.parse(self.id).ms


def parse_entry_id(text: str) -> str:
    """Normalise a user-given id (``<ms>-<seq>``; a bare ``<ms>`` means ``<ms>-0``)."""
    try:
        return str(StreamId.parse(text.strip()))
    except ValueError:
        raise InvalidEntryId(
            f"{text!r} is not a dead-letter entry id (expected <milliseconds>-<sequence>, "
            "as shown by 'relay dlq ls')"
        ) from None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
