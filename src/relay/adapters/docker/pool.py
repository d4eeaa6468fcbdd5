"""Bookkeeping of one function's warm pool: which containers are idle, busy or
starting, per image version, and why each one left.

No Docker calls here: the pool decides, the runtime carries out (starts and
removes containers). Everything runs on one event loop, so each decision is a
synchronous step between awaits and needs no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio

from relay.domain.events import ContainerAcquired, ContainerDiscarded, ContainerWaited
from relay.domain.execution import (
    ACQUIRE_COLD,
    ACQUIRE_WARM,
    DISCARD_CONCURRENCY_SHRINK,
    DISCARD_FUNCTION_REMOVED,
    DISCARD_IDLE_TIMEOUT,
    DISCARD_IMAGE_CHANGED,
    DISCARD_REASONS,
    DISCARD_SHUTDOWN,
    PoolSnapshot,
    RuntimeUnavailable,
)
from relay.domain.messages import DomainEvent


class PooledContainer(Protocol):
    @property
    def image(self) -> str: ...

    last_used: float


Observer = Callable[[DomainEvent], None]


@dataclass(eq=False)
class FunctionPool:
    """One function's containers. ``image`` is the current version."""

    function: str
    image: str
    runtime: str
    capacity: int
    observe: Observer
    # in release order (oldest first): only release appends, with last_used = now
    idle: list[PooledContainer] = field(default_factory=list)
    busy: set[PooledContainer] = field(default_factory=set)
    starting: int = 0
    removed: bool = False
    closed: bool = False
    warm_acquires: int = 0
    cold_starts: int = 0
    discards: dict[str, int] = field(default_factory=dict)
    waits: int = 0
    _waiters: list[anyio.Event] = field(default_factory=list)

    # --- leasing ----------------------------------------------------------------
    def current_count(self) -> int:
        """Containers of the current version (idle, busy or starting)."""
        busy_current = sum(1 for c in self.busy if c.image == self.image)
        return len(self.idle) + busy_current + self.starting

    def lease_idle(self) -> PooledContainer | None:
        """An idle container at once (warm), or ``None`` (then :meth:`lease`):
        the warm path without a coroutine."""
        if self.idle and not (self.removed or self.closed):
            return self._take_warm(time.monotonic())
        return None

    async def lease(self) -> PooledContainer | None:
        """An idle container (warm), or ``None``: a reserved start the caller must
        complete with :meth:`started` or :meth:`start_failed` (cold)."""
        begun = time.monotonic()
        waited = False
        while True:
            if self.removed or self.closed:
                raise RuntimeUnavailable(f'function "{self.function}" is not active')
            if self.idle:
                return self._take_warm(begun)
            if self.current_count() < self.capacity:
                self.starting += 1
                return None
            if not waited:
                waited = True
                self.waits += 1
                self.observe(ContainerWaited(function=self.function))
            event = anyio.Event()
            self._waiters.append(event)
            try:
                await event.wait()
            finally:
                if event in self._waiters:
                    self._waiters.remove(event)

    def _take_warm(self, begun: float) -> PooledContainer:
        container = self.idle.pop()  # most recently used: keeps the set small
        self.busy.add(container)
        self.warm_acquires += 1
        self.observe(
            ContainerAcquired(
                function=self.function, outcome=ACQUIRE_WARM, wait_s=time.monotonic() - begun
            )
        )
        return container

    def started(self, container: PooledContainer, begun: float) -> None:
        self.starting -= 1
        self.busy.add(container)
        self.cold_starts += 1
        self.observe(
            ContainerAcquired(
                function=self.function, outcome=ACQUIRE_COLD, wait_s=time.monotonic() - begun
            )
        )

    def start_failed(self) -> None:
        self.starting -= 1
        self._wake()

    # --- returning ----------------------------------------------------------------
    def release(self, container: PooledContainer) -> str | None:
        """Return a healthy container; the discard reason if it must go instead."""
        self.busy.discard(container)
        reason: str | None = None
        if self.closed:
            reason = DISCARD_SHUTDOWN
        elif self.removed:
            reason = DISCARD_FUNCTION_REMOVED
        elif container.image != self.image:
            reason = DISCARD_IMAGE_CHANGED
        elif (
            # below capacity in total means below it for the current version too;
            # only a pool at capacity in total needs its current version counted
            len(self.idle) + len(self.busy) + self.starting >= self.capacity
            and self.current_count() >= self.capacity
        ):
            reason = DISCARD_CONCURRENCY_SHRINK
        if reason is None:
            container.last_used = time.monotonic()
            self.idle.append(container)
        else:
            self.count_discard(reason)
        self._wake()
        return reason

    def discard_busy(self, container: PooledContainer, reason: str) -> None:
        """A leased container that broke (timeout, exit, protocol error)."""
        self.busy.discard(container)
        self.count_discard(reason)
        self._wake()

    def count_discard(self, reason: str) -> None:
        if reason == DISCARD_FUNCTION_REMOVED:
            return  # tombstoned: the function's series are already gone
        assert reason in DISCARD_REASONS, reason
        self.discards[reason] = self.discards.get(reason, 0) + 1
        self.observe(ContainerDiscarded(function=self.function, reason=reason))

    # --- changes of version, capacity, life -------------------------------------------
    def activate(self, image: str, runtime: str, capacity: int) -> list[PooledContainer]:
        """Apply a new version/capacity; returns idle containers to discard now."""
        self.removed = False
        gone: list[PooledContainer] = []
        if image != self.image:
            self.image, self.runtime = image, runtime
            gone += self._take_idle(DISCARD_IMAGE_CHANGED, keep=0)
        self.capacity = max(1, capacity)
        excess = self.current_count() - self.capacity
        if excess > 0:
            keep = max(0, len(self.idle) - excess)
            gone += self._take_idle(DISCARD_CONCURRENCY_SHRINK, keep=keep)
        self._wake()
        return gone

    def remove(self) -> list[PooledContainer]:
        self.removed = True
        gone = self._take_idle(DISCARD_FUNCTION_REMOVED, keep=0)
        self._wake()
        return gone

    def close(self) -> list[PooledContainer]:
        self.closed = True
        gone = self._take_idle(DISCARD_SHUTDOWN, keep=0)
        self._wake()
        return gone

    def evict_idle(self, idle_timeout_s: float, now: float) -> list[PooledContainer]:
        # idle is in release order: when the front is fresh, all are (the common case)
        if not self.idle or now - self.idle[0].last_used < idle_timeout_s:
            return []
        stale = [c for c in self.idle if now - c.last_used >= idle_timeout_s]
        for container in stale:
            self.idle.remove(container)
            self.count_discard(DISCARD_IDLE_TIMEOUT)
        if stale:
            self._wake()
        return stale

    def take_idle(self, container: PooledContainer, reason: str) -> None:
        """Retire one specific idle container (the worker-global LRU bound)."""
        self.idle.remove(container)
        self.count_discard(reason)
        self._wake()

    def drained(self) -> bool:
        return not self.idle and not self.busy and self.starting == 0

    def snapshot(self) -> PoolSnapshot:
        return PoolSnapshot(
            capacity=self.capacity,
            containers=len(self.idle) + len(self.busy),
            busy=len(self.busy),
            idle=len(self.idle),
            starting=self.starting,
            warm_acquires=self.warm_acquires,
            cold_starts=self.cold_starts,
            discarded=sum(self.discards.values()),
        )

    def _take_idle(self, reason: str, keep: int) -> list[PooledContainer]:
        # the oldest idle containers go first (the list's front)
        count = max(0, len(self.idle) - keep)
        gone, self.idle = self.idle[:count], self.idle[count:]
        for _ in gone:
            self.count_discard(reason)
        return gone

    def _wake(self) -> None:
        # wake every waiter: each re-checks the pool; a lost wake-up (a waiter
        # cancelled right after being chosen) is worse than a tiny herd
        for event in self._waiters:
            event.set()
        self._waiters.clear()
