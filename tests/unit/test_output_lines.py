"""Container output cut into lines (``relay.adapters.docker.lines``): bounded
memory, and each byte searched a bounded number of times, whatever arrives."""

from __future__ import annotations

import pytest

from relay.adapters.docker.lines import (
    MAX_LINE_BYTES,
    LineBuffer,
    ProtocolError,
    StderrReader,
    line_cut,
)

MARKER = b"\x1erelay-end:0123456789abcdef01234567"


class Searched(bytes):
    """Bytes that count how many bytes their searches look at."""

    looked = 0

    def find(self, sub: object, start: object = None, end: object = None) -> int:
        begin = start if isinstance(start, int) else 0
        stop = end if isinstance(end, int) else len(self)
        Searched.looked += max(0, stop - begin)
        return super().find(sub, start, end)  # type: ignore[arg-type]


@pytest.mark.parametrize("newline_every", [0, 1, 100, 5000])
def test_each_byte_is_searched_a_bounded_number_of_times(newline_every: int) -> None:
    # one byte at a time, the worst case: a rescan of what is held would look
    # at every held byte again for each new one
    Searched.looked = 0
    reader = StderrReader()
    total = MAX_LINE_BYTES + 4096
    emitted: list[bytes] = []
    for n in range(1, total + 1):
        byte = b"\n" if newline_every and n % newline_every == 0 else b"f"
        assert reader.take(Searched(byte), MARKER, emitted.append) is None
        assert reader.held <= MAX_LINE_BYTES
    assert Searched.looked <= 2 * total  # the marker search, then the newline search


def test_an_unfinished_line_keeps_its_head_and_counts_the_rest() -> None:
    buffer = LineBuffer()
    lines: list[bytes] = []
    for _ in range(1024):
        buffer.feed(b"h" * 1000, lines.append)
        assert buffer.held <= MAX_LINE_BYTES
    buffer.feed(b"\ntail", lines.append)
    assert lines == [b"h" * MAX_LINE_BYTES + line_cut(1024 * 1000 - MAX_LINE_BYTES)]
    buffer.end(lines.append)
    assert lines[-1] == b"tail"
    assert buffer.held == 0


def test_a_long_line_inside_one_chunk_is_cut_the_same() -> None:
    lines: list[bytes] = []
    LineBuffer().feed(b"a\n" + b"b" * (MAX_LINE_BYTES + 5) + b"\nc\n", lines.append)
    assert lines == [b"a", b"b" * MAX_LINE_BYTES + line_cut(5), b"c"]


def test_the_marker_is_found_wherever_the_stream_is_cut() -> None:
    stream = b"before\npartial" + MARKER + b'{"ok": true}\n' + b"after\n"
    following = b"\x1erelay-end:next"
    for cut in range(1, len(stream)):
        reader = StderrReader()
        lines: list[bytes] = []
        answer = reader.take(stream[:cut], MARKER, lines.append)
        if answer is None:
            answer = reader.take(stream[cut:], MARKER, lines.append)
            reader.begin(following, lines.append)  # the next request
        else:  # the frame ended in the first piece: the rest comes in the next request
            reader.begin(following, lines.append)
            assert reader.take(stream[cut:], following, lines.append) is None
        assert answer == b'{"ok": true}', cut
        assert lines == [b"before", b"partial", b"after"], cut


def test_a_frame_that_never_ends_is_a_protocol_error_within_the_cap() -> None:
    reader = StderrReader()
    assert reader.take(MARKER + b'{"ok": ', MARKER, lambda _: None) is None
    for _ in range(MAX_LINE_BYTES - len(b'{"ok": ')):
        assert reader.take(b"x", MARKER, lambda _: None) is None
        assert reader.held <= MAX_LINE_BYTES
    with pytest.raises(ProtocolError, match="has no end"):
        reader.take(b"x", MARKER, lambda _: None)
