"""Log context of the work in progress: which message, function, handler, attempt.

The dispatcher binds these around each message and each attempt, so every log
line emitted meanwhile (from any layer: the runtime's ``container_discarded``,
a subscriber's line) carries them. One context variable holding a small mapping,
set and reset with a plain context manager: on the hot path that costs a fraction
of a microsecond, where structlog's ``bound_contextvars`` (a variable per key and
a generator-based context manager) cost several per event.
``merge_log_context`` is the structlog processor that adds them to a line.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from contextvars import ContextVar, Token
from types import MappingProxyType, TracebackType
from typing import Any

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_context: ContextVar[Mapping[str, Any]] = ContextVar("relay_log_context", default=_EMPTY)


class log_context:
    """``with log_context(message_id=...):`` adds fields to every log line inside."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: Any) -> None:
        self._fields = fields
        self._token: Token[Mapping[str, Any]] | None = None

    def __enter__(self) -> None:
        current = _context.get()
        self._token = _context.set({**current, **self._fields} if current else self._fields)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            _context.reset(self._token)


def merge_log_context(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: the bound fields, unless the line sets them itself."""
    for key, value in _context.get().items():
        event_dict.setdefault(key, value)
    return event_dict
