"""The events ``relay publish`` reads: ``--event`` (``--count`` times) or stdin lines.

Stdin is streamed: one JSON object per line, read as bytes with a bounded
``readline``, so a line of any length (a runaway producer, a binary file piped by
mistake) costs at most ``MAX_EVENT_BYTES`` plus a little of memory; the rest of an
oversized line is skipped in chunks and only counted.

What is published when a line is bad (``docs/producing.md``): events go out in
batches of ``BATCH`` checked lines; the batch holding the first bad line and
everything after it is not published. Every bad line is still reported, one line
each with its number, so one run lists them all; when something was published
before, a last line says which lines it came from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Final

from relay.domain.errors import EventError
from relay.entrypoints.cli.event_input import parse_event

BATCH: Final = 500  # events per transaction (or per pipeline on Redis)
_SLACK: Final = 4096  # whitespace and a CR a line may carry around its event
_SKIP_CHUNK: Final = 64 * 1024


def checked(text: str, source: str, limit: int) -> bytes:
    """The event's bytes, or :class:`EventError`: a JSON object within ``limit``."""
    payload = text.strip().encode()
    if len(payload) > limit:
        raise EventError(f"{source}: event is {len(payload)} bytes, over MAX_EVENT_BYTES ({limit})")
    parse_event(text, source)
    return payload


def repeated(event: str, count: int, limit: int) -> Iterator[list[bytes]]:
    """``--event`` ``count`` times, ``BATCH`` at a time (checked once, first)."""
    payload = checked(event, "--event", limit)
    for start in range(0, count, BATCH):
        yield [payload] * min(BATCH, count - start)


@dataclass
class StdinRun:
    """What reading stdin found: bad lines, and the lines handed out to publish."""

    report: Callable[[str], None]
    bad: int = 0
    events: int = 0  # events in the batches handed out
    through_line: int = 0  # the last line of the last batch handed out

    def batches(self, stdin: BinaryIO, limit: int) -> Iterator[list[bytes]]:
        """Checked payloads, ``BATCH`` at a time, as stdin is read; none once a
        line was bad (later lines are still checked and reported)."""
        batch: list[bytes] = []
        for number, found in _lines(stdin, limit):
            if isinstance(found, EventError):
                self.bad += 1
                self.report(str(found))
                batch = []
            elif self.bad == 0:
                batch.append(found)
                if len(batch) >= BATCH:
                    yield self._handed_out(batch, number)
                    batch = []
        if batch and self.bad == 0:
            yield self._handed_out(batch, number)

    def _handed_out(self, batch: list[bytes], number: int) -> list[bytes]:
        self.events += len(batch)
        self.through_line = number
        return batch

    def summary(self) -> str | None:
        """The last line after bad input, when the bad lines alone do not say it all."""
        if self.bad == 0 or (self.bad == 1 and self.events == 0):
            return None
        bad = f"{self.bad} bad line{'s' if self.bad != 1 else ''}"
        if self.events == 0:
            return f"{bad}; nothing was published"
        return (
            f"{bad}; published the {self.events} event(s) of lines 1-{self.through_line}"
            f" (ids above), nothing from line {self.through_line + 1} on"
        )


def _lines(stdin: BinaryIO, limit: int) -> Iterator[tuple[int, bytes | EventError]]:
    """(line number, checked payload or why it is refused); blank lines skipped."""
    cap = limit + _SLACK
    number = 0
    while chunk := stdin.readline(cap + 1):
        number += 1
        source = f"stdin line {number}"
        if len(chunk) > cap and not chunk.endswith(b"\n"):
            size = len(chunk) + _skip_rest(stdin)
            yield number, EventError(
                f"{source}: event is {size} bytes, over MAX_EVENT_BYTES ({limit})"
            )
            continue
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield number, EventError(f"{source}: not UTF-8 text (byte {exc.start + 1})")
            continue
        if not text.strip():
            continue
        try:
            yield number, checked(text, source, limit)
        except EventError as exc:
            yield number, exc


def _skip_rest(stdin: BinaryIO) -> int:
    """Read past the rest of a line; its length (without the newline)."""
    skipped = 0
    while chunk := stdin.readline(_SKIP_CHUNK):
        if chunk.endswith(b"\n"):
            return skipped + len(chunk) - 1
        skipped += len(chunk)
    return skipped
