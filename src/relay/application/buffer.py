"""The local buffer both stream loops share (``MAX_BUFFERED_EVENTS``).

A message holds a place in the :class:`MessageBuffer` from the moment the
consumer loop reads it or the recovery loop reclaims it until its dispatch ends
(acknowledged, dead-lettered or left pending); a loop reserves its places
(:class:`Places`) before it asks the broker. The loops themselves are in
:mod:`relay.application.consumer`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import anyio


class MessageBuffer:
    """At most ``size`` messages held locally; a message id is held once.

    A loop reserves places *before* it asks the broker (:meth:`reserve`), for as
    many messages as it asks for: what the broker hands over then always has a
    place, even when the other loop filled the rest of the buffer meanwhile. (A
    message read without a place would sit in the pending list, unprocessed,
    until the recovery loop's next pass found it idle.)
    """

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError("the buffer size must be positive")
        self.size = size
        self._held: set[str] = set()
        self._reserved = 0
        self._changed: anyio.Event | None = None

    @property
    def occupancy(self) -> int:
        """The ``buffered_events`` gauge."""
        return len(self._held)

    @property
    def free(self) -> int:
        """Places neither held nor reserved."""
        return self.size - len(self._held) - self._reserved

    def take(self, message_id: str) -> bool:
        """Hold ``message_id``; False when full or already held (being processed)."""
        if message_id in self._held or self.free <= 0:
            return False
        self._held.add(message_id)
        return True

    @contextlib.contextmanager
    def reserve(self, count: int) -> Iterator[Places]:
        """Up to ``count`` free places, kept for the messages of one broker call;
        the places not taken are given back when the block ends."""
        places = Places(self, max(0, min(count, self.free)))
        self._reserved += places.count
        try:
            yield places
        finally:
            if places.left:
                self._reserved -= places.left
                places.given_back, places.left = places.left, 0
                self._notify()

    def release(self, message_id: str) -> None:
        self._held.discard(message_id)
        self._notify()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait_empty(self) -> None:
        """Wait until nothing is held or reserved (shutdown's drain)."""
        while self._held or self._reserved:
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()

    def room(self, batch: int = 1) -> bool:
        """Whether :meth:`wait_free` would return at once."""
        return not (self.free <= 0 or (self._held and self.free < batch))

    async def wait_free(self, batch: int = 1) -> None:
        """Wait until a place is free; while messages are in flight, until ``batch``
        places are (so a busy worker reads in batches, not one message per read)."""
        while self.free <= 0 or (self._held and self.free < batch):
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()


class Places:
    """Places reserved in a :class:`MessageBuffer` for one broker call."""

    def __init__(self, buffer: MessageBuffer, count: int) -> None:
        self._buffer = buffer
        self.count = count
        self.left = count
        self.given_back = 0

    def take(self, message_id: str) -> bool:
        """Hold ``message_id`` in a reserved place; False when it is already held
        (being processed) or every reserved place is taken."""
        buffer = self._buffer
        if self.left <= 0 or message_id in buffer._held:
            return False
        self.left -= 1
        buffer._reserved -= 1
        buffer._held.add(message_id)
        return True
