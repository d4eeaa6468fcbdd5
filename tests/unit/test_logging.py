"""The slog-style line format and LOG_LEVEL filtering."""

from __future__ import annotations

import io

import pytest
import structlog

from relay.entrypoints.logging import configure_logging, render_value


@pytest.fixture(autouse=True)
def _reset_structlog() -> object:
    yield None
    structlog.reset_defaults()


def test_line_format_and_quoting() -> None:
    out = io.StringIO()
    configure_logging("INFO", stream=out)
    structlog.get_logger("t").info(
        "functions_loaded", count=3, function="user-events", error='bad "quote"\nnext'
    )
    line = out.getvalue().strip()
    assert line.startswith("time=")
    fields = line.split(" ", 3)
    assert fields[1] == "level=INFO"
    assert fields[2] == "msg=functions_loaded"
    assert 'count=3 function=user-events error="bad \\"quote\\"\\nnext"' in line
    assert "\n" not in line


def test_level_filter_and_warn_name() -> None:
    out = io.StringIO()
    configure_logging("WARN", stream=out)
    log = structlog.get_logger("t")
    log.debug("hidden_debug")
    log.info("hidden_info")
    log.warning("shown_warn")
    log.error("shown_error")
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["level=WARN", "level=ERROR"]


def test_exception_is_one_line() -> None:
    out = io.StringIO()
    configure_logging("DEBUG", stream=out)
    try:
        raise ValueError("boom")
    except ValueError:
        structlog.get_logger("t").exception("failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert 'error="ValueError: boom"' in lines[0]


def test_render_value() -> None:
    assert render_value("plain-value_1.2") == "plain-value_1.2"
    assert render_value("two words") == '"two words"'
    assert render_value("") == '""'
    assert render_value(1.5) == "1.5"
