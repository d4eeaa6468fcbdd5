"""A human-readable description of a cron expression, in 24-hour time.

Display only (``relay function inspect``): ``0 3 * * *`` is "At 03:00" and
``0 8 * * 1-5`` is "At 08:00, Monday through Friday". Forms it does not know return
``None`` and the caller prints the raw expression alone; it never raises.
"""

from __future__ import annotations

import re

_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_DAY_NAMES = {d[:3].upper(): i for i, d in enumerate(_DAYS)}
_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July",
    "August", "September", "October", "November", "December",
)  # fmt: skip
_MONTH_NAMES = {m[:3].upper(): i + 1 for i, m in enumerate(_MONTHS)}
_NUMBER = re.compile(r"[0-9]{1,2}")
_STEP = re.compile(r"\*/([0-9]{1,2})")


def describe(cron: str) -> str | None:
    """Describe ``cron`` (5 fields, or 6 with seconds first), or ``None``."""
    try:
        return _describe(cron)
    except (ValueError, IndexError):
        return None


def _describe(cron: str) -> str | None:
    fields = cron.split()
    if len(fields) == 6:
        second, fields = fields[0], fields[1:]
    elif len(fields) == 5:
        second = "0"
    else:
        return None
    minute, hour, dom, month, dow = fields
    when = _time_of_day(second, minute, hour)
    if when is None:
        return None
    parts = [when]
    for text in (_day_of_month(dom), _month(month), _weekdays(dow)):
        if text is None:
            return None
        if text:
            parts.append(text)
    return ", ".join(parts)


def _num(text: str, low: int, high: int) -> int | None:
    if _NUMBER.fullmatch(text) is None:
        return None
    value = int(text)
    return value if low <= value <= high else None


def _time_of_day(second: str, minute: str, hour: str) -> str | None:
    sec = _num(second, 0, 59)
    if sec is None:
        return None
    m = _num(minute, 0, 59)
    if m is not None:
        return _at_minute(sec, m, hour)
    if sec or hour != "*":
        return None
    if minute == "*":
        return "Every minute"
    every = _step(minute)
    return f"Every {every} minutes" if every else None


def _at_minute(sec: int, m: int, hour: str) -> str | None:
    suffix = f":{sec:02d}" if sec else ""
    hours = [_num(h, 0, 23) for h in hour.split(",")]
    if all(h is not None for h in hours):
        return "At " + _join([f"{h:02d}:{m:02d}{suffix}" for h in hours if h is not None])
    if hour == "*":
        return f"At minute {m:02d}{' and second ' + str(sec) if sec else ''} of every hour"
    every = _step(hour)
    return f"At minute {m:02d}{suffix} of every {every} hours" if every else None


def _step(text: str) -> int | None:
    step = _STEP.fullmatch(text)
    return int(step.group(1)) or None if step else None


def _day_of_month(dom: str) -> str | None:
    if dom in ("*", "?"):
        return ""
    day = _num(dom, 1, 31)
    return f"on day {day} of the month" if day is not None else None


def _month(month: str) -> str | None:
    if month == "*":
        return ""
    first, _, last = month.partition("-")
    a = _month_number(first)
    if a is None:
        return None
    if not last:
        return f"only in {_MONTHS[a - 1]}"
    b = _month_number(last)
    return f"{_MONTHS[a - 1]} through {_MONTHS[b - 1]}" if b is not None else None


def _month_number(text: str) -> int | None:
    return _MONTH_NAMES.get(text.upper()) or _num(text, 1, 12)


def _weekdays(dow: str) -> str | None:
    if dow in ("*", "?"):
        return ""
    if "-" in dow and "," not in dow:
        first, _, last = dow.partition("-")
        a, b = _day_number(first), _day_number(last)
        if a is None or b is None:
            return None
        return f"{_DAYS[a]} through {_DAYS[b]}"
    days = [_day_number(d) for d in dow.split(",")]
    if any(d is None for d in days):
        return None
    return "only on " + _join([_DAYS[d] for d in days if d is not None])


def _day_number(text: str) -> int | None:
    if text.upper() in _DAY_NAMES:
        return _DAY_NAMES[text.upper()]
    day = _num(text, 0, 7)
    return None if day is None else day % 7


def _join(items: list[str]) -> str:
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
