"""The slog-style line format, LOG_LEVEL filtering and each LOG_FORMAT parsed back."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import threading
from functools import partial

import anyio
import anyio.lowlevel
import pytest
import structlog

from relay.adapters.linewriter import MAX_QUEUED_CHARS, writer_for
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


@pytest.mark.anyio
@pytest.mark.timeout(60)  # the old blocking write never returns: fail, do not hang
async def test_a_stderr_nobody_reads_never_blocks_the_loop_and_drops_are_said() -> None:
    r, w = os.pipe()  # blocking, as a stderr piped into a stalled log shipper
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.extend(iter(partial(os.read, r, 65536), b"")))
    try:
        with os.fdopen(w, "w", closefd=False) as stderr:
            try:
                configure_logging("INFO", stream=stderr)
                log = structlog.get_logger("t")
                for n in range(20_000):  # about 1.6 MB; the pipe takes 64 KiB
                    log.info("flooded", n=n)
                    if n % 100 == 0:
                        await anyio.lowlevel.checkpoint()
                writer = writer_for(stderr, "stderr")
                assert writer is not None
                assert writer.peak <= MAX_QUEUED_CHARS
                assert writer.dropped > 0
            finally:
                reader.start()  # the reader comes back (and a write stuck in it ends)
            writer.close()
        os.close(w)
        reader.join(30)
    finally:
        os.close(r)
    lines = b"".join(read).decode().splitlines()
    said = [int(line.split()[1]) for line in lines if line.startswith("relay: ")]
    assert sum(said) == writer.dropped
    assert len([line for line in lines if "msg=flooded" in line]) + writer.dropped == 20_000


# --- LOG_FORMAT -----------------------------------------------------------------
def _logged(log_format: str) -> list[str]:
    out = io.StringIO()
    configure_logging("INFO", stream=out, log_format=log_format)
    log = structlog.get_logger("t")
    log.info("functions_loaded", count=3, function="user-events", error='bad "q"\nnext', ok=True)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", function="f")
    return out.getvalue().splitlines()


def _logfmt_pairs(line: str) -> dict[str, str]:
    # shlex reads logfmt's quoting (double quotes, backslash escapes) as a shell does
    return dict(word.split("=", 1) for word in shlex.split(line))


_MS_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def test_json_lines_load_back_with_the_same_keys() -> None:
    first, second = (json.loads(line) for line in _logged("json"))
    assert list(first)[:3] == ["time", "level", "msg"]
    assert _MS_UTC.fullmatch(first["time"])
    assert first | {"time": None} == {
        "time": None, "level": "INFO", "msg": "functions_loaded", "count": 3,
        "function": "user-events", "error": 'bad "q"\nnext', "ok": True,
    }  # fmt: skip
    assert (second["level"], second["msg"], second["error"]) == ("ERROR", "failed",
                                                                 "ValueError: boom")  # fmt: skip


@pytest.mark.parametrize("log_format", ["logfmt", "console"])
def test_logfmt_and_console_lines_parse_back_as_pairs(log_format: str) -> None:
    first, second = (_logfmt_pairs(line) for line in _logged(log_format))
    assert list(first)[:3] == ["time", "level", "msg"]
    assert _MS_UTC.fullmatch(first["time"])
    assert (first["level"], first["msg"], first["count"]) == ("INFO", "functions_loaded", "3")
    assert first["error"] == 'bad "q"\\nnext'  # one line: the newline stays escaped
    assert (second["level"], second["error"]) == ("ERROR", "ValueError: boom")


def test_the_console_format_is_todays_slog_text() -> None:
    [line, _] = _logged("console")
    assert re.fullmatch(
        r'time=\S+Z level=INFO msg=functions_loaded count=3 function=user-events '
        r'error="bad \\"q\\"\\nnext" ok=True', line)  # fmt: skip


def test_capture_logs_sees_the_fields_whatever_the_format() -> None:
    configure_logging("INFO", stream=io.StringIO(), log_format="json")
    with structlog.testing.capture_logs() as captured:
        structlog.get_logger("t").warning("dlq_trim_failed", error="redis down")
    assert captured == [{"event": "dlq_trim_failed", "error": "redis down", "log_level": "warning"}]
