"""Logging, configured once, here.

Relay's own records are one line each, in the format ``LOG_FORMAT`` names, each
drawn by structlog's own renderer:

- ``console`` (the default): the ``key=value`` text form operators know from Go's
  slog, ``time=... level=INFO msg=worker_started key=value`` (``ConsoleRenderer``
  with one column per leading key, no colours, no rich);
- ``logfmt``: the same keys as strict logfmt (``LogfmtRenderer``);
- ``json``: one JSON object per line (``JSONRenderer``), for a log shipper.

Every format has the same keys: ``time`` (UTC, milliseconds, ``Z``), ``level``
(slog's names: DEBUG, INFO, WARN, ERROR), ``msg`` (the stable snake_case event
name) and the fields; an exception is one ``error`` field (its last line), never a
multi-line traceback. Handler output is not logged through here: it is forwarded
raw on stdout by the runtime in the spec's ``relay: function "..." handler "..."``
form whatever the format, and is not filtered by ``LOG_LEVEL``. Lines go out
through a bounded writer thread (:mod:`relay.adapters.linewriter`): a stderr nobody
reads drops log lines, counted, instead of stalling the worker's event loop.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any, TextIO

import structlog
from structlog.dev import Column, ConsoleRenderer, KeyValueColumnFormatter, plain_traceback
from structlog.processors import JSONRenderer, LogfmtRenderer
from structlog.typing import Processor

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
_LEADING = ("time", "level", "msg")
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


def _slog_keys(_logger: Any, method: str, event: MutableMapping[str, Any]) -> dict[str, Any]:
    """time, level and msg first (every format), then the fields; an exception as
    one ``error`` field: its last line, never a multi-line traceback."""
    level = _SLOG_NAMES.get(str(event.pop("level", method)).lower(), "INFO")
    msg = event.pop("event", "")
    exc = event.pop("exception", None)
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    record = {"time": now, "level": level, "msg": msg, **event}
    if exc:
        record["error"] = str(exc).strip().splitlines()[-1]
    return record


def _slog_column(key: str) -> Column:
    return Column(key, KeyValueColumnFormatter(
        key_style="", value_style="", reset_style="", value_repr=render_value))  # fmt: skip


def renderer(log_format: str) -> Processor:
    """structlog's own renderer for ``log_format`` (one of ``config.LOG_FORMATS``);
    with columns, ``ConsoleRenderer`` draws no colours (and imports no rich)."""
    if log_format == "json":
        return JSONRenderer()
    if log_format == "logfmt":
        return LogfmtRenderer(key_order=list(_LEADING), bool_as_flag=False)
    # console: slog's text form; "" is the column of every other field, in order
    return ConsoleRenderer(
        exception_formatter=plain_traceback,  # never reached: _slog_keys took it
        sort_keys=False,
        columns=[*(_slog_column(key) for key in _LEADING), _slog_column("")],
    )


class _LineLogger:
    """structlog's final logger: each rendered event is one line for ``write``."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write

    def msg(self, message: str) -> None:
        self._write(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def configure_logging(
    level: str = "INFO", stream: TextIO | None = None, log_format: str = "console"
) -> None:
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
            structlog.processors.format_exc_info,
            _slog_keys,
            renderer(log_format),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )
