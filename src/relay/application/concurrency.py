"""Concurrency slots: the worker-global ``MAX_CONCURRENCY`` then the function's own.

An invocation takes the global slot first, then its function's slot, both
within one bounded wait. When the wait runs out it raises ``SlotUnavailable``:
the caller leaves the message pending for a later redelivery and charges no
attempt. Per-function limits are clipped to ``MAX_CONCURRENCY`` and resized live;
an in-flight invocation releases to the limiter it acquired from.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from relay.domain.execution import SlotUnavailable


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
        self._global = anyio.CapacityLimiter(max_concurrency)
        self._functions: dict[str, anyio.CapacityLimiter] = {}
        self.waits_total = 0
        self.waits_by_function: dict[str, int] = {}
        self.timeouts_total = 0
        self.in_flight = 0

    def effective(self, capacity: int) -> int:
        """``min(concurrency, MAX_CONCURRENCY)``, at least 1."""
        return max(1, min(capacity, self.max_concurrency))

    def resize(self, function: str, capacity: int) -> None:
        """Set the function's limit (clipped); takes effect for new acquisitions."""
        total = self.effective(capacity)
        limiter = self._functions.get(function)
        if limiter is None:
            self._functions[function] = anyio.CapacityLimiter(total)
        else:
            limiter.total_tokens = total

    def forget(self, function: str) -> None:
        """Drop a removed function's limiter (holders still release to it)."""
        self._functions.pop(function, None)
        self.waits_by_function.pop(function, None)

    def capacity(self, function: str) -> int:
        limiter = self._functions.get(function)
        return int(limiter.total_tokens) if limiter is not None else self.max_concurrency

    @asynccontextmanager
    async def acquire(self, function: str) -> AsyncIterator[None]:
        """Hold the global then the function slot for the body's duration."""
        limiter = self._functions.get(function)
        if limiter is None:
            limiter = self._functions[function] = anyio.CapacityLimiter(self.max_concurrency)
        borrower = object()
        held: list[anyio.CapacityLimiter] = []
        # Fast path (no cancel scope, no timer): both slots free right now.
        for each in (self._global, limiter):
            try:
                each.acquire_on_behalf_of_nowait(borrower)
            except anyio.WouldBlock:
                break
            held.append(each)
        if len(held) < 2:
            await self._wait(function, limiter, borrower, held)
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            limiter.release_on_behalf_of(borrower)
            self._global.release_on_behalf_of(borrower)

    async def _wait(
        self,
        function: str,
        limiter: anyio.CapacityLimiter,
        borrower: object,
        held: list[anyio.CapacityLimiter],
    ) -> None:
        """Take the slots not ``held`` yet within the bounded wait, or give back
        what is held and raise ``SlotUnavailable``."""
        self._count_wait(function)
        try:
            with anyio.move_on_after(self.wait_s) as scope:
                for each in (self._global, limiter)[len(held) :]:
                    await each.acquire_on_behalf_of(borrower)
                    held.append(each)
        except BaseException:
            # cancelled from outside while waiting (shutdown): give back what we took
            for each in held:
                each.release_on_behalf_of(borrower)
            raise
        if scope.cancelled_caught:
            for each in held:
                each.release_on_behalf_of(borrower)
            self.timeouts_total += 1
            raise SlotUnavailable(
                f'function "{function}": no concurrency slot within {self.wait_s:g}s; '
                "left pending for redelivery"
            )

    def _count_wait(self, function: str) -> None:
        self.waits_total += 1
        self.waits_by_function[function] = self.waits_by_function.get(function, 0) + 1
