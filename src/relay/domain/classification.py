"""The classification a message's ledger records once (its ``@class`` value).

One codec: the dispatcher encodes what a message matched, ``relay trace`` (text
and ``--json``) decodes it. The stored text is unchanged from before this module:
``matched:<f1>,<f2>``, ``unmatched``, a schedule occurrence's id (matching
bypassed), or ``""`` while the catalog is not loaded (the class waits).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Final

import msgspec

from relay.domain.schedule import ID_PREFIX

MATCHED_PREFIX: Final = "matched:"
UNMATCHED: Final = "unmatched"
WAITING: Final = ""


class ClassKind(StrEnum):
    """What kind of classification a message received."""

    MATCHED = "matched"
    UNMATCHED = "unmatched"
    OCCURRENCE = "occurrence"
    WAITING = "waiting"
    OTHER = "other"  # a value this version does not write (kept as text)


class Classification(msgspec.Struct, frozen=True):
    """A decoded ``@class`` value: its kind, the matched functions and the text."""

    kind: ClassKind
    text: str
    functions: tuple[str, ...] = ()


def matched(functions: Sequence[str]) -> str:
    """The classification of an event that matched ``functions`` (in order)."""
    return MATCHED_PREFIX + ",".join(functions)


def decode(text: str) -> Classification:
    """The meaning of a stored classification (the token already split off)."""
    if text.startswith(MATCHED_PREFIX):
        names = tuple(text.removeprefix(MATCHED_PREFIX).split(","))
        return Classification(ClassKind.MATCHED, text, names)
    if text.startswith(ID_PREFIX):
        return Classification(ClassKind.OCCURRENCE, text)
    if text == UNMATCHED:
        return Classification(ClassKind.UNMATCHED, text)
    if text == WAITING:
        return Classification(ClassKind.WAITING, text)
    return Classification(ClassKind.OTHER, text)
