"""Stream retention: which entries a trim may remove, as pure arithmetic.

A Redis stream id is ``<milliseconds>-<sequence>``; ``XTRIM key MINID <cutoff>``
removes every entry whose id is strictly below ``cutoff``. Retention wants the
cutoff ``now - retention``, but on servers without ``XTRIM ... ACKED`` (Redis
older than 8.2) that can delete entries a consumer group still needs. So the
cutoff is clamped so that, for every group on the stream, it never passes

* the group's oldest pending entry (delivered, not yet acknowledged), nor
* the first id after the group's last-delivered id (everything above that has
  not been delivered to the group yet).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, NamedTuple

from relay.domain.durations import HOUR, MILLISECOND, MINUTE

MAX_SEQUENCE: Final = 2**64 - 1
"""The largest sequence number Redis accepts in a stream id."""

MIN_TICK_NS: Final = MINUTE
MAX_TICK_NS: Final = HOUR
TICKS_PER_WINDOW: Final = 24


class StreamId(NamedTuple):
    """A stream entry id; tuples compare in stream order."""

    ms: int
    seq: int

    @classmethod
    def parse(cls, text: str | bytes) -> StreamId:
        """Parse ``<ms>-<seq>`` (or a bare ``<ms>``, meaning sequence 0).

        Raises ``ValueError`` for anything else.
        """
        raw = text.decode() if isinstance(text, bytes) else text
        ms_text, sep, seq_text = raw.partition("-")
        if not ms_text.isdigit() or (sep and not seq_text.isdigit()):
            raise ValueError(f"not a stream id: {raw!r}")
        seq = int(seq_text) if sep else 0
        if seq > MAX_SEQUENCE or int(ms_text) > MAX_SEQUENCE:
            raise ValueError(f"stream id out of range: {raw!r}")
        return cls(int(ms_text), seq)

    def successor(self) -> StreamId:
        """The smallest id greater than this one."""
        if self.seq < MAX_SEQUENCE:
            return StreamId(self.ms, self.seq + 1)
        return StreamId(self.ms + 1, 0)

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


class GroupPosition(NamedTuple):
    """What retention must know about one consumer group on the stream."""

    name: str
    last_delivered: StreamId
    oldest_pending: StreamId | None
    """``None`` when the group has nothing pending."""


class Cutoff(NamedTuple):
    """The trim decision: trim below ``effective``; ``limited_by`` names the
    group that held the cutoff back (``None`` when the window decided)."""

    window: StreamId
    effective: StreamId
    limited_by: str | None


def window_cutoff(now_ms: int, retention_ns: int) -> StreamId:
    """``now - retention`` as a stream id (``<ms>-0``), never below ``0-0``."""
    return StreamId(max(0, now_ms - retention_ns // MILLISECOND), 0)


def safe_cutoff(window: StreamId, groups: Iterable[GroupPosition]) -> Cutoff:
    """Clamp ``window`` so that no group loses a pending or undelivered entry."""
    effective, limited_by = window, None
    for group in groups:
        bounds = [group.last_delivered.successor()]
        if group.oldest_pending is not None:
            bounds.append(group.oldest_pending)
        bound = min(bounds)
        if bound < effective:
            effective, limited_by = bound, group.name
    return Cutoff(window=window, effective=effective, limited_by=limited_by)


def trim_interval_ns(retention_ns: int) -> int:
    """How often to trim: a 24th of the window, clamped to one minute .. one hour."""
    return min(MAX_TICK_NS, max(MIN_TICK_NS, retention_ns // TICKS_PER_WINDOW))
