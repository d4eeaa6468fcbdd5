"""An in-memory :class:`relay.application.ports.EventPublisher`, on the real rules.

It appends to an :class:`tests.fakes.InMemoryEventStream`; a delayed publication
waits in ``delayed`` until :meth:`InMemoryEventPublisher.move_due` (the Redis
mover's part, called by whoever drives the fake clock) puts it in the stream,
under a ``delayed-<due>-<n>`` id until then, as on Redis. Keys, their window and
the delay's bound come from :mod:`relay.domain.publication`, as for both brokers.
``fail_next`` makes that many appends raise as an outage would (nothing written).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import anyio.lowlevel

from relay.domain.errors import DependencyUnavailable
from relay.domain.priority import priority_class
from relay.domain.publication import (
    DEFAULT_DEDUP_WINDOW_NS,
    Publication,
    check_all,
    delayed_id,
    due_ms,
    key_record,
)
from tests.fakes import FakeClock, InMemoryEventStream


class InMemoryEventPublisher:
    def __init__(
        self,
        stream: InMemoryEventStream,
        clock: FakeClock,
        *,
        dedup_window_ns: int = DEFAULT_DEDUP_WINDOW_NS,
    ) -> None:
        self._stream = stream
        self._clock = clock
        self._window_ms = dedup_window_ns // 1_000_000
        self.delayed: dict[str, tuple[int, bytes]] = {}  # delayed id -> (due ms, event)
        self.keys: dict[str, tuple[str, int]] = {}  # key record -> (first id, expiry ms)
        self.moved: dict[str, str] = {}  # delayed id -> the stream id it was moved to
        self.fail_next = 0
        self._numbers = itertools.count(1)

    def now_ms(self) -> int:
        return int(self._clock.now() * 1000)

    async def append(self, publications: Sequence[Publication]) -> list[str]:
        await anyio.lowlevel.checkpoint()
        if self.fail_next > 0:
            self.fail_next -= 1
            raise DependencyUnavailable("redis publish failed: connection refused")
        now = self.now_ms()
        for p in publications:
            priority_class(p.priority)
        check_all(publications, now)
        return [self._one(p, now) for p in publications]

    def _one(self, p: Publication, now: int) -> str:
        record = None if p.idempotency_key is None else key_record(
            self._stream.stream, p.idempotency_key
        )
        held = None if record is None else self.keys.get(record)
        if held is not None and held[1] > now:
            return held[0]
        due = due_ms(p.deliver_at_ms, now)
        if due is None:
            message_id = self._stream.add(p.payload)
        else:
            message_id = delayed_id(due, next(self._numbers))
            self.delayed[message_id] = (due, p.payload)
        if record is not None:
            self.keys[record] = (message_id, now + self._window_ms)
        return message_id

    def move_due(self) -> int:
        """Move every due delayed event into the stream, in due order; how many."""
        now = self.now_ms()
        due = sorted((at, i) for i, (at, _) in self.delayed.items() if at <= now)
        for _, delayed in due:
            _, payload = self.delayed.pop(delayed)
            self.moved[delayed] = self._stream.add(payload)
        return len(due)
