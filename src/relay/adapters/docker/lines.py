"""A container's output streams cut into lines, in bounded memory and one pass.

Every byte a container sends is looked at a bounded number of times: a
delimiter (a newline, the answer frame's marker) is searched for only in the
bytes just received, never again in what is held from before. What is held is
bounded whatever the container sends: an unfinished line keeps at most
``MAX_LINE_BYTES``; the rest of that line is dropped, counted, and said at its
end (``line_cut``), so an endless line costs Relay 64 KiB, not the whole flood.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

MAX_LINE_BYTES: Final = 64 * 1024

Emit = Callable[[bytes], None]


class ProtocolError(Exception):
    """The bootstrap (or what pretends to be it) sent something that is not a valid frame."""


def line_cut(dropped: int) -> bytes:
    """What ends a line longer than ``MAX_LINE_BYTES``, in place of its rest."""
    return f" [relay: line cut at {MAX_LINE_BYTES} bytes, {dropped} more dropped]".encode()


class LineBuffer:
    """Complete lines out, at most ``MAX_LINE_BYTES`` of the unfinished one held."""

    __slots__ = ("_dropped", "_line")

    def __init__(self) -> None:
        self._line = bytearray()
        self._dropped = 0

    @property
    def held(self) -> int:
        """Bytes held for the unfinished line."""
        return len(self._line)

    def feed(self, data: bytes, emit: Emit) -> None:
        """Emit every line ``data`` completes; hold (the head of) its unfinished rest."""
        find = data.find
        start = 0
        while (end := find(b"\n", start)) >= 0:
            if self._line or self._dropped:
                self._hold(data, start, end)
                self.end(emit)
            elif end - start > MAX_LINE_BYTES:
                emit(data[start : start + MAX_LINE_BYTES] + line_cut(end - start - MAX_LINE_BYTES))
            else:
                emit(data[start:end])
            start = end + 1
        if start < len(data):
            self._hold(data, start, len(data))

    def end(self, emit: Emit) -> None:
        """Emit the unfinished line as a line of its own (nothing when there is none)."""
        if not self._line and not self._dropped:
            return
        line = bytes(self._line)
        if self._dropped:
            line += line_cut(self._dropped)
        self._line.clear()
        self._dropped = 0
        emit(line)

    def _hold(self, data: bytes, start: int, end: int) -> None:
        room = MAX_LINE_BYTES - len(self._line)
        if end - start <= room:
            self._line += data[start:end]
            return
        if room > 0:
            self._line += data[start : start + room]
        self._dropped += end - start - max(room, 0)


class StderrReader:
    """The stderr stream: output lines, and the answer frame its marker starts.

    Only the exact marker with the current request's nonce starts a frame; a
    frame may begin mid-line (it ends that line) and must end, with a newline,
    within ``MAX_LINE_BYTES``. What follows a frame is output printed after the
    answer: it is kept (one chunk's worth at most) for the next request."""

    __slots__ = ("_after", "_frame", "_tail", "lines")

    def __init__(self) -> None:
        self.lines = LineBuffer()
        # the end of the last chunk when it may be the start of a marker
        self._tail = b""
        # the answer frame being received, after its marker (None: not in one)
        self._frame: bytearray | None = None
        self._after = b""

    @property
    def held(self) -> int:
        """Bytes held in all: the unfinished line, a frame's start, what follows an answer."""
        frame = len(self._frame) if self._frame is not None else 0
        return self.lines.held + len(self._tail) + frame + len(self._after)

    def begin(self, marker: bytes, emit: Emit) -> None:
        """A new request: what came after the previous answer is this one's output."""
        self._frame = None
        after, self._after = self._after, b""
        if after:
            answer = self.take(after, marker, emit)
            if answer is not None:  # the nonce is new: only a forger could have sent this
                raise ProtocolError("an answer arrived before its request")

    def take(self, data: bytes, marker: bytes, emit: Emit) -> bytes | None:
        """Emit the lines ``data`` completes; the answer's JSON once its frame is whole."""
        frame = self._frame
        if frame is not None:
            return self._frame_part(frame, data)
        if self._tail:
            data = self._tail + data  # at most the marker's length, once
            self._tail = b""
        at = data.find(marker)
        if at < 0:
            keep = _marker_start(data, marker)
            if keep:
                self._tail = data[-keep:]
                data = data[:-keep]
            self.lines.feed(data, emit)
            return None
        if at:
            self.lines.feed(data[:at], emit)
        self.lines.end(emit)  # a frame after a partial line ends that line
        self._frame = bytearray()
        return self._frame_part(self._frame, data[at + len(marker) :])

    def _frame_part(self, frame: bytearray, data: bytes) -> bytes | None:
        end = data.find(b"\n")
        if end < 0:
            if len(frame) + len(data) > MAX_LINE_BYTES:
                raise ProtocolError("the answer frame has no end")
            frame += data
            return None
        self._frame = None
        self._after = data[end + 1 :]
        if frame:
            frame += data[:end]
            return bytes(frame)
        return data[:end]

    def end(self, emit: Emit) -> None:
        """The stream ends or the request is over: emit what is held as output."""
        if self._tail:
            self.lines.feed(self._tail, emit)
            self._tail = b""
        self._frame = None  # an unfinished frame is no output of the handler's
        self.lines.end(emit)


def _marker_start(data: bytes, marker: bytes) -> int:
    """How many bytes at the end of ``data`` could be the start of ``marker``."""
    start = data.rfind(marker[:1], max(0, len(data) - len(marker) + 1))
    if start < 0 or not marker.startswith(data[start:]):
        return 0
    return len(data) - start
