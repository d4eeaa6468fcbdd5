"""The slog-style line format and LOG_LEVEL filtering."""

from __future__ import annotations

import io
import os
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
