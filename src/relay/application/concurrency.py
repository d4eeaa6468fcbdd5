"""Concurrency slots: the worker-global ``MAX_CONCURRENCY`` and the function's own.

An invocation holds one global and one function slot, both taken together within
one bounded wait. When the wait runs out it raises ``SlotUnavailable``: the
caller leaves the message pending for a later redelivery and charges no
attempt. Per-function limits are clipped to ``MAX_CONCURRENCY`` and resized live;
an in-flight invocation releases to the limit it acquired from.

Waiters queue in arrival order. A freed slot goes at once to the oldest waiter
that can run now (a waiter whose function is at its own limit does not hold up
one of another function), so free capacity and an eligible waiter never exist
together. Taking a free slot costs no scheduler turn and no timer; only a wait
arms one. Every handled event passes here, under load mostly through the wait,
which is why this is not two stacked ``anyio.CapacityLimiter`` (a timer, three
checkpoints and borrower bookkeeping per event).
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType

from relay.domain.execution import SlotUnavailable


class _Limit:
    __slots__ = ("total", "used")

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0


class _Waiter:
    """One blocked acquisition: ``wake`` is done once it is granted or gives up."""

    __slots__ = ("granted", "limit", "wake")

    def __init__(self, limit: _Limit, wake: asyncio.Future[None]) -> None:
        self.limit = limit
        self.wake = wake
        self.granted = False


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # (cancelled with its task, or already woken)
        future.set_result(None)


class Slots:
    """Global and per-function concurrency slots with a bounded wait.

    Counters for metrics (plain attributes): ``waits_total`` (acquisitions that
    had to block), ``waits_by_function``, ``timeouts_total`` (waits that gave up)
    and the gauge ``in_flight`` (slots currently held).
    """

    def __init__(self, max_concurrency: int, wait_s: float = 10.0) -> None:
        if max_concurrency <= 0:
            raise ValueError("max_concurrency must be positive")
        self.max_concurrency = max_concurrency
        self.wait_s = wait_s
        self._global = _Limit(max_concurrency)
        self._functions: dict[str, _Limit] = {}
        self._waiters: deque[_Waiter] = deque()
        self.waits_total = 0
        self.waits_by_function: dict[str, int] = {}
        self.timeouts_total = 0
        self.in_flight = 0

    def effective(self, capacity: int) -> int:
        """``min(concurrency, MAX_CONCURRENCY)``, at least 1."""
        return max(1, min(capacity, self.max_concurrency))

    def resize(self, function: str, capacity: int) -> None:
        """Set the function's limit (clipped). Growing admits waiters at once;
        shrinking lets running invocations finish and limits new ones."""
        total = self.effective(capacity)
        limit = self._functions.get(function)
        if limit is None:
            self._functions[function] = _Limit(total)
        else:
            limit.total = total
            self._grant()

    def forget(self, function: str) -> None:
        """Drop a removed function's limit (holders still release to it)."""
        self._functions.pop(function, None)
        self.waits_by_function.pop(function, None)

    def capacity(self, function: str) -> int:
        limit = self._functions.get(function)
        return limit.total if limit is not None else self.max_concurrency

    def acquire(self, function: str) -> _Held:
        """``async with slots.acquire(fn):`` holds both slots for the body."""
        return _Held(self, function)

    # --- internals ------------------------------------------------------------------
    async def _take(self, function: str) -> _Limit:
        limit = self._functions.get(function)
        if limit is None:
            limit = self._functions[function] = _Limit(self.max_concurrency)
        if self._global.used < self._global.total and limit.used < limit.total:
            self._hold(limit)
            return limit
        self.waits_total += 1
        self.waits_by_function[function] = self.waits_by_function.get(function, 0) + 1
        # A bare future and one timer handle, not an Event in a cancel scope: nearly
        # every invocation of a busy worker waits here, and the scope's entry and
        # exit cost several microseconds each (bench/dispatch_cpu.py).
        loop = asyncio.get_running_loop()
        waiter = _Waiter(limit, loop.create_future())
        self._waiters.append(waiter)
        timer = loop.call_later(self.wait_s, _wake, waiter.wake)
        try:
            await waiter.wake
        except BaseException:
            # cancelled from outside (shutdown): give back a slot granted meanwhile
            self._abandon(waiter)
            raise
        finally:
            timer.cancel()
        if not waiter.granted:  # granted as the timer fired: the slot is ours
            self._abandon(waiter)
            self.timeouts_total += 1
            raise SlotUnavailable(
                f'function "{function}": no concurrency slot within {self.wait_s:g}s; '
                "left pending for redelivery"
            )
        return limit

    def _hold(self, limit: _Limit) -> None:
        self._global.used += 1
        limit.used += 1
        self.in_flight += 1

    def _release(self, limit: _Limit) -> None:
        self._global.used -= 1
        limit.used -= 1
        self.in_flight -= 1
        if self._waiters:
            self._grant()

    def _abandon(self, waiter: _Waiter) -> None:
        if waiter.granted:
            self._release(waiter.limit)
        else:
            self._waiters.remove(waiter)

    def _grant(self) -> None:
        """Hand free slots to the oldest waiters that can run now."""
        waiters = self._waiters
        for waiter in list(waiters):
            if self._global.used >= self._global.total:
                return
            if waiter.limit.used < waiter.limit.total:
                waiters.remove(waiter)
                self._hold(waiter.limit)
                waiter.granted = True
                _wake(waiter.wake)


class _Held:
    """One acquisition, as an async context manager (no generator per event)."""

    __slots__ = ("_function", "_limit", "_slots")

    def __init__(self, slots: Slots, function: str) -> None:
        self._slots = slots
        self._function = function
        self._limit: _Limit | None = None

    async def __aenter__(self) -> None:
        self._limit = await self._slots._take(self._function)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        limit, self._limit = self._limit, None
        if limit is not None:
            self._slots._release(limit)
