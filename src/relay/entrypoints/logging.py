"""Logging, configured once, here.

Relay's own records are rendered one per line in the ``key=value`` text form
operators know from Go's slog: ``time=... level=INFO msg=worker_started key=value``.
``msg`` is the stable snake_case event name; everything else is a field. Handler
output is not logged through here: it is forwarded raw by the runtime and is not
filtered by ``LOG_LEVEL``. Lines go out through a bounded writer thread
(:mod:`relay.adapters.linewriter`): a stderr nobody reads drops log lines,
counted, instead of stalling the worker's event loop.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, MutableMapping
from datetime import datetime
from typing import Any, TextIO

import structlog

from relay.adapters.linewriter import writer_for
from relay.application.log_context import merge_log_context

_LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
}
_SLOG_NAMES = {
    "debug": "DEBUG",
    "info": "INFO",
    "warning": "WARN",
    "warn": "WARN",
    "error": "ERROR",
    "critical": "ERROR",
    "exception": "ERROR",
}
_BARE = re.compile(r"^[A-Za-z0-9_./:@+,-]+$")


def render_value(value: object) -> str:
    """Quote a value the way slog's text handler does: bare when safe, else quoted."""
    text = value if isinstance(value, str) else _to_text(value)
    if text and _BARE.match(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _to_text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


class SlogRenderer:
    """structlog processor rendering an event dict as one slog-style text line."""

    def __call__(self, _logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
        timestamp = event.pop("timestamp", None) or datetime.now().astimezone().isoformat(
            timespec="seconds"
        )
        level = _SLOG_NAMES.get(str(event.pop("level", method)).lower(), "INFO")
        msg = event.pop("event", "")
        exc = event.pop("exception", None)
        parts = [f"time={timestamp}", f"level={level}", f"msg={render_value(msg)}"]
        parts += [f"{key}={render_value(val)}" for key, val in event.items()]
        if exc:
            # One line: the exception's last line, never a multi-line traceback.
            parts.append(f"error={render_value(str(exc).strip().splitlines()[-1])}")
        return " ".join(parts)


def _timestamp(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    event["timestamp"] = datetime.now().astimezone().isoformat(timespec="seconds")
    return event


class _LineLogger:
    """structlog's final logger: each rendered event is one line for ``write``."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write

    def msg(self, message: str) -> None:
        self._write(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def configure_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Configure structlog for the whole process; call once from an entrypoint.

    A stream with a file descriptor (stderr by default) is written by a bounded
    writer thread; an in-memory one (tests) directly."""
    target = stream or sys.stderr
    writer = writer_for(target, "stderr")
    factory: Any
    if writer is None:
        factory = structlog.PrintLoggerFactory(file=target)
    else:
        logger = _LineLogger(writer.line)

        def factory(*_args: object) -> _LineLogger:
            return logger

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            merge_log_context,
            structlog.processors.add_log_level,
            _timestamp,
            structlog.processors.format_exc_info,
            SlogRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
