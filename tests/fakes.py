"""In-memory fakes of the ports, for unit tests. Fakes record what happened as
plain attributes; they are never mocks of Relay's own modules."""

from __future__ import annotations

import itertools


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self._now = now
        self._mono = 1000.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._mono += seconds


class SequentialTokens:
    """Predictable fencing tokens: t1, t2, ..."""

    def __init__(self) -> None:
        self._n = itertools.count(1)

    def token(self) -> str:
        return f"t{next(self._n)}"
