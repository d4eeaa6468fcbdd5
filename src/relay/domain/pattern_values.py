"""Values in the pattern language: type-tagged equality, RFC3339 instants, messages.

Shared by the pattern compiler, its condition nodes and the rule index.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Final

OPERATORS: Final = ("equals", "prefix", "suffix", "exists", "gt", "gte", "lt", "lte")
OPERATOR_SET: Final = frozenset(OPERATORS)
COMPARISONS: Final[dict[str, tuple[Callable[[float, float], bool], str, str]]] = {
    # operator: (comparison, numeric wording, temporal wording)
    "gt": (operator.gt, "greater than", "after"),
    "gte": (operator.ge, "greater than or equal to", "at or after"),
    "lt": (operator.lt, "less than", "before"),
    "lte": (operator.le, "less than or equal to", "at or before"),
}
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")

# A key path through nested objects and the equality keys allowed there.
EqualityCondition = tuple[tuple[str, ...], frozenset[object]]


def equality_key(value: object) -> object | None:
    """The canonical, type-tagged form used for equality, or ``None`` for a
    non-scalar (a list or an object never equals a pattern value).

    Strings stand for themselves; numbers compare by value (``1`` equals ``1.0``) but
    never equal a boolean or a string (``1`` is not ``true``, not ``"1"``).
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    if value is None:
        return ("z",)
    return None


def is_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | bool | int | float)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def show(value: object, limit: int = 80) -> str:
    """A value as JSON text, shortened for one-line messages."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True, default=repr)
    except (ValueError, TypeError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show_list(values: tuple[object, ...]) -> str:
    return "[" + ", ".join(show(v) for v in values) + "]"


def field_path(where: str, key: str) -> str:
    return f"{where}.{key}" if _PLAIN_KEY.fullmatch(key) else f"{where}[{show(key)}]"


def parse_rfc3339(text: str) -> float | None:
    """An RFC3339 timestamp as unix seconds, or ``None`` when it is not one."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    try:
        instant = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None
    seconds = instant.timestamp()
    if m.group(9) is not None:
        off_h, off_m = int(m.group(10)), int(m.group(11))
        if off_h > 23 or off_m > 59:
            return None
        offset = off_h * 3600 + off_m * 60
        seconds = seconds - offset if m.group(9) == "+" else seconds + offset
    fraction = float(m.group(7)) if m.group(7) else 0.0
    return seconds + fraction


def format_instant(seconds: float) -> str:
    try:
        moment = datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return "out of range"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def value_at(event: object, path: tuple[str, ...]) -> tuple[bool, object]:
    """Follow ``path`` through nested objects: (present, value)."""
    value = event
    for key in path:
        if (type(value) is dict or isinstance(value, Mapping)) and key in value:
            value = value[key]
        else:
            return False, None
    return True, value
