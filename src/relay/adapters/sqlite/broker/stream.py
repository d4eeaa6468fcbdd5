"""The embedded broker's consumer side: :class:`relay.application.ports.EventStream`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import anyio

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.domain.outcome import Reclaimed, StreamMessage

POLL_S: Final = 0.02  # how often a blocked read looks for other processes' publishes


class SqliteEventStream:
    """One consumer of the broker file's queue.

    ``read`` leases ready jobs (one ``BEGIN IMMEDIATE`` transaction, aging across
    the four priority classes, a fresh token per lease); ``reclaim`` takes over
    leases idle longer than the recovery loop's threshold. ``ensure_group``, at
    a worker's start, makes every lease its previous process held ready again.
    The group is the file: one group per broker file.
    """

    def __init__(self, store: BrokerStore, *, stream: str, group: str, consumer: str) -> None:
        self._store = store
        self._stream = stream
        self._group = group
        self._consumer = consumer
        self._waker = store.waker()

    @property
    def stream(self) -> str:
        return self._stream

    @property
    def group(self) -> str:
        return self._group

    @property
    def consumer(self) -> str:
        return self._consumer

    async def ensure_group(self) -> None:
        stream, consumer = self._stream, self._consumer
        await self._store.write(lambda c, now: jobs.release_consumer(c, now, stream, consumer))

    async def read(
        self, count: int, block_ms: int, patience_s: float = 10.0
    ) -> Sequence[StreamMessage]:
        stream, consumer = self._stream, self._consumer
        deadline = anyio.current_time() + block_ms / 1000
        waker = self._waker
        while True:
            waker.clear()
            leased = await self._store.write(
                lambda c, now: jobs.claim(c, now, stream, consumer, count), undo=jobs.give_back
            )
            if leased or anyio.current_time() >= deadline:
                return self._held(leased)
            with anyio.move_on_after(min(POLL_S, max(0.0, deadline - anyio.current_time()))):
                await waker.wait()

    async def reclaim(self, min_idle_ms: int, count: int) -> Reclaimed:
        stream, consumer = self._stream, self._consumer
        await self._store.write(jobs.purge)
        taken = await self._store.write(
            lambda c, now: jobs.reclaim(c, now, stream, consumer, min_idle_ms, count),
            undo=jobs.give_back,
        )
        return Reclaimed(messages=tuple(self._held(taken)), complete=len(taken) < count)

    async def drop(self, ids: Sequence[str]) -> None:
        """Nothing to drop: a job's body lives in its row and is never deleted
        before the job is acknowledged."""

    def _held(self, leased: list[tuple[StreamMessage, str]]) -> list[StreamMessage]:
        for message, token in leased:
            seq = jobs.seq_of(message.id)
            assert seq is not None
            self._store.leases[seq] = token
        return [message for message, _ in leased]
