"""Relay's own output written from a thread (``relay.adapters.linewriter``): a
pipe nobody reads never stalls the event loop, the queue stays bounded, and
every line is either written or counted as dropped, said in one line."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
from collections.abc import Iterator

import anyio
import anyio.lowlevel
import pytest

from relay.adapters.docker.runtime import _stdout_line
from relay.adapters.linewriter import (
    MAX_QUEUED_CHARS,
    BoundedLineWriter,
    DroppedLines,
    dropped_line,
    writer_for,
)

pytestmark = pytest.mark.anyio

LINES = 20_000
LINE = "x" * 99  # 100 characters with its newline: 2 MB in all, the pipe takes 64 KiB
CAP = 64 * 1024


class Drain:
    """Reads a pipe's read end in a thread, once started."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = bytearray()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while chunk := os.read(self.fd, 1 << 16):
            self.data += chunk

    def join(self) -> list[str]:
        self._thread.join(30)
        assert not self._thread.is_alive()
        return self.data.decode().splitlines()


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()  # blocking, as a stdout piped into a stalled reader
    yield r, w
    for fd in (r, w):
        with contextlib.suppress(OSError):  # the test closed it already
            os.close(fd)


async def flood_from_the_loop(write: object, ticks: list[int]) -> None:
    """Write every line from the event loop, yielding now and then, while
    another task ticks: if a write blocked, the loop (and the test) would stop."""

    async def ticker() -> None:
        while True:
            ticks.append(1)
            await anyio.lowlevel.checkpoint()

    assert callable(write)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        for n in range(LINES):
            write(LINE)
            if n % 100 == 0:
                await anyio.lowlevel.checkpoint()
        tg.cancel_scope.cancel()


@pytest.mark.timeout(60)  # the old blocking write never returns: fail, do not hang
async def test_a_pipe_nobody_reads_never_blocks_the_loop_and_the_queue_stays_bounded(
    pipe: tuple[int, int],
) -> None:
    r, w = pipe
    writer = BoundedLineWriter(w, "stdout", max_chars=CAP)
    ticks: list[int] = []
    await flood_from_the_loop(writer.line, ticks)
    assert len(ticks) >= LINES // 100  # the loop kept running throughout
    assert writer.peak <= CAP
    assert writer.queued <= CAP
    assert writer.dropped > 0
    drain = Drain(r)
    drain.start()  # the reader comes back
    writer.close()
    os.close(w)
    assert_all_accounted_for(drain.join(), writer)


def assert_all_accounted_for(lines: list[str], writer: BoundedLineWriter) -> None:
    """Every line was written or counted, and the count was said where it happened."""
    markers = [line for line in lines if line.startswith("relay: ")]
    assert markers
    counts = [int(line.split()[1]) for line in markers]
    assert markers == [dropped_line(n, "stdout").rstrip("\n") for n in counts]
    assert sum(counts) == writer.dropped
    assert lines.count(LINE) + writer.dropped == LINES  # nothing lost without a word


@pytest.mark.timeout(60)  # the old blocking write never returns: fail, do not hang
async def test_forwarded_handler_lines_never_block_the_loop_on_a_stalled_stdout(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    r, w = pipe
    drain = Drain(r)
    with os.fdopen(w, "w", closefd=False) as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        try:
            ticks: list[int] = []
            await flood_from_the_loop(_stdout_line, ticks)  # the runtime's default output
            writer = writer_for(stdout, "stdout")
            assert writer is not None
            assert writer.peak <= MAX_QUEUED_CHARS
            assert writer.dropped > 0
        finally:
            drain.start()  # the reader comes back (and a write stuck in it ends)
        writer.close()
    os.close(w)
    assert_all_accounted_for(drain.join(), writer)


async def test_closing_writes_out_what_is_queued(pipe: tuple[int, int]) -> None:
    r, w = pipe
    drain = Drain(r)
    drain.start()
    writer = BoundedLineWriter(w, "stdout")
    for n in range(1000):
        writer.line(f"line {n}")
    writer.close()
    writer.line("after close")  # written at once: the thread is done
    os.close(w)
    assert drain.join() == [f"line {n}" for n in range(1000)] + ["after close"]
    assert writer.dropped == 0


async def test_after_close_a_stalled_pipe_drops_instead_of_hanging_the_exit(
    pipe: tuple[int, int],
) -> None:
    _, w = pipe
    os.set_blocking(w, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(w, b"z" * 4096)  # the pipe is full: its reader stalled
    os.set_blocking(w, True)
    writer = BoundedLineWriter(w, "stderr")
    writer.close(timeout_s=0.05)
    writer.line("relay_stopped")  # would block for ever if written directly
    assert writer.dropped == 1


async def test_a_reader_that_went_away_drops_and_counts(pipe: tuple[int, int]) -> None:
    r, w = pipe
    os.close(r)
    writer = BoundedLineWriter(w, "stdout")
    writer.line("into the void")  # EPIPE in the thread: never raised here
    writer.close()
    writer.line("and again")
    assert writer.dropped >= 1


def test_one_writer_per_file_and_none_for_memory(pipe: tuple[int, int]) -> None:
    _, w = pipe
    other = os.dup(w)  # as stdout and stderr on one pipe (2>&1)
    with os.fdopen(w, "w", closefd=False) as first, os.fdopen(other, "w") as second:
        one = writer_for(first, "stdout")
        assert one is not None
        assert writer_for(second, "stderr") is one  # never two threads on one pipe
        one.close()
    assert writer_for(io.StringIO(), "stdout") is None


def test_drops_are_a_metric(pipe: tuple[int, int]) -> None:
    _, w = pipe
    with os.fdopen(w, "w", closefd=False) as stream:
        writer = writer_for(stream, "stdout")
        assert writer is not None
        writer.dropped += 3  # as if the pipe had stalled
        samples = {
            (s.name, s.labels.get("stream")): s.value
            for family in DroppedLines().collect()
            for s in family.samples
        }
        writer.close()
    assert samples[("output_lines_dropped_total", "stdout")] >= 3
