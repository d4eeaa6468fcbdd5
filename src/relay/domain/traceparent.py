"""The W3C Trace Context ``traceparent`` a producer may send beside an event.

Format (version 00): ``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``,
lower case, neither id all zeros. A later version may append fields after the
flags (``-...``); the first four are read and the rest ignored, as the
recommendation says. Anything else is not a traceparent: it is ignored (never a
reason to fail a message), so :func:`valid_traceparent` answers ``""`` for it.
"""

from __future__ import annotations

import re
from typing import Final

TRACEPARENT_FIELD: Final = "traceparent"  # the stream entry's field beside ``event``
MAX_TRACEPARENT_CHARS: Final = 256  # a longer value is refused before the pattern runs

_PATTERN: Final = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16


def valid_traceparent(raw: str | bytes | None) -> str:
    """``raw`` when it is a usable traceparent (the version-00 part of a later
    version's), else ``""``."""
    if not raw or len(raw) > MAX_TRACEPARENT_CHARS:
        return ""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("ascii")
        except UnicodeDecodeError:
            return ""
    match = _PATTERN.fullmatch(raw.strip())
    if match is None:
        return ""
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return ""
    if version == "00" and rest is not None:
        return ""  # version 00 has exactly four fields
    return f"{version}-{trace_id}-{span_id}-{flags}" if rest else raw.strip()


def traceparent_text(trace_id: int, span_id: int, sampled: bool) -> str:
    """The version-00 traceparent of a span context."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"
