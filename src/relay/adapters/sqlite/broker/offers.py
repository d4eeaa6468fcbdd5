"""What this process's readers were handed and have not begun yet.

A read only *peeks* (:func:`relay.adapters.sqlite.broker.jobs.peek`): the job
stays ready until ``begin`` leases it and claims its invocations in one
transaction (:func:`relay.adapters.sqlite.broker.jobs.hold`). Between the two,
the job is *offered* to one reader, so another reader of this process is handed
other jobs instead of colliding on the same head of the queue. An offer lapses
after :data:`OFFER_MS` (a reader that never began is not waited for: its begin
would then find the job taken and answer ``lost``), so the table stays bounded
by what the readers hold. A reader takes and records its offers in one go (the
lock), and a begun job's offer is withdrawn only once the begin's transaction
ended, so no reader of this process can see it ready and unoffered meanwhile.

Readers in *other* processes cannot see these offers. When a begin finds jobs
another process took first (a collision: both peeked the same head; the other
may even have settled them already), this process moves to a random *lane*:
its next reads leave ``lane`` x :data:`LANE_BATCHES` batches at the head to the
others (a process's readers hold several batches there at once: one lane of
one batch still overlapped them, row 350). The lane falls back to 0 after
:data:`CALM_HOLDS` begins without a collision, so a process left alone never
leaves the head waiting.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable
from typing import Final

OFFER_MS: Final = 30_000
LANES: Final = 4
LANE_BATCHES: Final = 4  # batches a lane's step leaves to the other processes
CALM_HOLDS: Final = 16


class Offers:
    """The jobs handed out and not begun, with the lane (thread-safe)."""

    def __init__(self) -> None:
        self._until: dict[int, int] = {}
        self.lane = 0
        self._calm = 0
        self._lock = threading.Lock()

    def take(self, now_ms: int, choose: Callable[[set[int], int], list[int]]) -> list[int]:
        """``choose(offered, lane)`` picks jobs not offered yet; they are offered
        from now on (one reader at a time, so two never pick the same)."""
        with self._lock:
            lapsed = [seq for seq, until in self._until.items() if until <= now_ms]
            for seq in lapsed:
                del self._until[seq]
            chosen = choose(set(self._until), self.lane * LANE_BATCHES)
            until = now_ms + OFFER_MS
            for seq in chosen:
                self._until[seq] = until
            return chosen

    def forget(self, seqs: Iterable[int]) -> None:
        with self._lock:
            for seq in seqs:
                self._until.pop(seq, None)

    def begun(self, seqs: Iterable[int], *, collided: bool) -> None:
        """A begin held (or lost) these jobs and its transaction ended;
        ``collided``: another process had taken some of them first."""
        with self._lock:
            for seq in seqs:
                self._until.pop(seq, None)
            if collided:
                self.lane = random.randrange(LANES)  # noqa: S311 - spreading, not secrecy
                self._calm = 0
            elif self.lane:
                self._calm += 1
                if self._calm >= CALM_HOLDS:
                    self.lane, self._calm = 0, 0

    def snapshot(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._until)
