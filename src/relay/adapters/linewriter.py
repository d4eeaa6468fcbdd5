"""Relay's own output (forwarded handler lines, its log) written from a thread.

A write to stdout or stderr blocks while the pipe is full: a log shipper that
stalls, a terminal scrolled back, a ``| less`` nobody reads. Written from the
event loop, that froze every invocation of the worker. A
:class:`BoundedLineWriter` takes whole lines without ever blocking: they wait
in a queue (at most ``max_chars`` characters) that a thread of its own writes
out. When the pipe is slower than the output, new lines are dropped, counted,
and one line says how many where they went missing::

    relay: 1234 lines dropped: stdout is not keeping up

Closing writes out what is queued, waiting at most ``CLOSE_BUDGET_S``.

A file descriptor has one writer (:func:`writer_for`): stdout and stderr on
the same pipe (``2>&1``) share it, so lines never interleave mid-line.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import threading
from collections import deque
from collections.abc import Iterable
from typing import Final, TextIO

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

# Characters queued per file at most (about a second of a busy worker's output).
MAX_QUEUED_CHARS: Final = 1 << 20
CLOSE_BUDGET_S: Final = 2.0


def dropped_line(count: int, stream: str) -> str:
    """The line that stands for ``count`` lines dropped on ``stream``."""
    return f"relay: {count} lines dropped: {stream} is not keeping up\n"


class BoundedLineWriter:
    """Whole lines to ``fd`` from a thread; callers never block."""

    def __init__(self, fd: int, stream: str, *, max_chars: int = MAX_QUEUED_CHARS) -> None:
        self.fd = fd
        self.stream = stream
        self._max = max_chars
        self._queue: deque[str] = deque()
        self._queued = 0  # characters queued or being written
        self._ready = threading.Condition(threading.Lock())
        self._unreported = 0  # lines dropped since the last marker
        self._closing = False
        self._budget = CLOSE_BUDGET_S  # how long a write after close may wait
        self._failed = False
        self.dropped = 0  # lines dropped in all
        self.peak = 0  # the most characters ever queued
        self._thread = threading.Thread(target=self._run, name=f"relay-{stream}", daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def queued(self) -> int:
        """Characters waiting to be written (or being written)."""
        return self._queued

    def line(self, text: str) -> None:
        """Queue ``text`` and a newline; drop it (counted) when the queue is full."""
        self.write(text + "\n")

    def write(self, text: str) -> None:
        """Queue ``text`` (one or more whole lines, newline included)."""
        size = len(text)
        with self._ready:
            if self._closing:
                self._write_late(text)
                return
            if self._queued + size > self._max or self._failed:
                self.dropped += 1
                self._unreported += 1
                return
            if self._unreported:  # said where the lines went missing
                self._put(dropped_line(self._unreported, self.stream))
                self._unreported = 0
            self._put(text)
            self._ready.notify()

    def close(self, timeout_s: float = CLOSE_BUDGET_S) -> None:
        """Write out what is queued (within ``timeout_s``), then stop the thread.

        Later lines are written directly: the loop they could stall is over."""
        with self._ready:
            self._closing = True
            self._budget = timeout_s
            self._ready.notify()
        self._thread.join(timeout_s)

    # --- the writing thread --------------------------------------------------------------
    def _put(self, text: str) -> None:
        self._queue.append(text)
        self._queued += len(text)
        self.peak = max(self.peak, self._queued)

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closing:
                    self._ready.wait()
                if not self._queue:
                    return  # closing, and everything is written
                batch = "".join(self._queue)
                self._queue.clear()
            self._send(batch)
            with self._ready:
                self._queued -= len(batch)
                if self._unreported and not self._queue:  # the drops came last
                    self._put(dropped_line(self._unreported, self.stream))
                    self._unreported = 0

    def _send(self, text: str) -> None:
        data = memoryview(text.encode("utf-8", "backslashreplace"))
        while data and not self._failed:
            try:
                data = data[os.write(self.fd, data) :]
            except BlockingIOError:  # a non-blocking descriptor: wait until it takes more
                select.select([], [self.fd], [])
            except InterruptedError:
                continue
            except OSError:
                # the reader is gone (EPIPE) or the descriptor closed: nothing can be
                # written any more; what comes is dropped and counted
                self._failed = True

    def _write_late(self, text: str) -> None:
        """After close: written at once if the pipe takes it within the close
        budget (the thread is done), else dropped: exit never hangs on a reader."""
        if not self._thread.is_alive() and not self._failed:
            with contextlib.suppress(OSError, ValueError):
                _, ready, _ = select.select([], [self.fd], [], self._budget)
                if ready:
                    self._send(text)
                    return
        self.dropped += 1


_WRITERS: dict[tuple[int, int], BoundedLineWriter] = {}
_LOCK = threading.Lock()


def writer_for(stream: TextIO, name: str) -> BoundedLineWriter | None:
    """The one writer of the file behind ``stream``; None when it has no file
    descriptor (an in-memory stream cannot block). Closed at exit."""
    try:
        fd = stream.fileno()
        info = os.fstat(fd)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None
    with contextlib.suppress(Exception):
        stream.flush()  # what was printed through it before comes first
    key = (info.st_dev, info.st_ino)
    with _LOCK:
        writer = _WRITERS.get(key)
        if writer is None or writer.closed or not _same_file(writer.fd, key):
            writer = _WRITERS[key] = BoundedLineWriter(fd, name)
            atexit.register(writer.close)
        return writer


def _same_file(fd: int, key: tuple[int, int]) -> bool:
    try:
        info = os.fstat(fd)
    except OSError:
        return False
    return (info.st_dev, info.st_ino) == key


def writers() -> list[BoundedLineWriter]:
    with _LOCK:
        return list(_WRITERS.values())


class DroppedLines(Collector):
    """``output_lines_dropped_total{stream}``: lines Relay's writers dropped."""

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "output_lines_dropped",
            "Lines of Relay's output (handler lines, logs) dropped because the "
            "stream was not keeping up.",
            labels=["stream"],
        )
        counts: dict[str, int] = {}
        for writer in writers():
            counts[writer.stream] = counts.get(writer.stream, 0) + writer.dropped
        for stream, count in sorted(counts.items()):
            family.add_metric([stream], count)
        yield family
