"""``relay publish``'s stdin reader: bounded reads, one report per bad line."""

from __future__ import annotations

import io

from relay.entrypoints.cli.publish_input import BATCH, StdinRun


class _Endless(io.RawIOBase):
    """A stdin holding one line of ``size`` bytes, made as it is read, then a good
    line; records the largest read it was asked for."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.tail = b'\n{"after": 1}\n'
        self.largest = 0

    def readable(self) -> bool:
        return True

    def readline(self, size: int | None = -1) -> bytes:
        assert size is not None, "an unbounded readline would hold the line"
        assert size > 0, "an unbounded readline would hold the line"
        self.largest = max(self.largest, size)
        if self.left:
            chunk = b"x" * min(size, self.left)
            self.left -= len(chunk)
            return chunk
        line, _, self.tail = self.tail.partition(b"\n")
        return line + b"\n" if line or self.tail else b""


def test_a_huge_line_is_read_in_bounded_pieces_and_reported_with_its_size() -> None:
    """Row 234: 200 MB on one line never sits in memory: each read is at most the
    limit plus a little, and the line is refused with its size."""
    stdin = _Endless(200 * 1024 * 1024)
    reports: list[str] = []
    run = StdinRun(report=reports.append)
    assert list(run.batches(stdin, 1024)) == []  # type: ignore[arg-type]
    assert reports == [f"stdin line 1: event is {200 * 1024 * 1024} bytes,"
                       " over MAX_EVENT_BYTES (1024)"]  # fmt: skip
    assert stdin.largest <= 64 * 1024  # the limit plus slack, or a chunk skipped
    assert run.summary() is None  # one bad line, nothing published: its line says it all


def test_batches_stop_at_the_first_bad_line_and_later_lines_are_still_checked() -> None:
    lines = [b'{"n": %d}' % n for n in range(BATCH + 10)]
    lines[BATCH + 3] = b"[]"
    lines.append(b"nope")
    reports: list[str] = []
    run = StdinRun(report=reports.append)
    batches = list(run.batches(io.BytesIO(b"\n".join(lines) + b"\n"), 1024))
    assert [len(b) for b in batches] == [BATCH]
    assert [r.split(":")[0] for r in reports] == [f"stdin line {BATCH + 4}",
                                                  f"stdin line {BATCH + 11}"]  # fmt: skip
    assert run.summary() == (
        f"2 bad lines; published the {BATCH} event(s) of lines 1-{BATCH} (ids above),"
        f" nothing from line {BATCH + 1} on"
    )


def test_blank_lines_count_but_are_skipped_and_a_last_line_needs_no_newline() -> None:
    run = StdinRun(report=lambda _: None)
    batches = list(run.batches(io.BytesIO(b'\n  \r\n{"a": 1}\r\n{"b": 2}'), 1024))
    assert batches == [[b'{"a": 1}', b'{"b": 2}']]
    assert (run.bad, run.events, run.through_line) == (0, 2, 4)
