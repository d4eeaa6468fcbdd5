"""The embedded broker's consumer side: :class:`relay.application.ports.EventStream`."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Final

import anyio
import anyio.lowlevel

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.domain.outcome import Reclaimed, StreamMessage

POLL_S: Final = 0.02  # how often a blocked read looks for other processes' publishes


class SqliteEventStream:
    """One consumer of the broker file's queue.

    ``read`` only peeks at ready jobs (aging across the four priority classes, no
    write, so no commit): each message carries a fresh delivery handle, and the
    ledger's ``begin`` leases the job with it and claims its invocations in one
    transaction, answering ``lost`` for a job another consumer took first. A job
    is therefore leased and claimed by one durable commit, and settled and
    acknowledged by a second. ``reclaim`` takes over leases idle longer than the
    recovery loop's threshold. ``ensure_group``, at a worker's start, makes every
    lease its previous process held ready again. The group is the file: one
    group per broker file.
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
        stream = self._stream
        deadline = anyio.current_time() + block_ms / 1000
        waker = self._waker
        store = self._store
        offers = store.offers
        handed: list[StreamMessage] = []
        due: list[int | None] = [None]  # the next delayed job's time, when none is ready

        def peek(c: sqlite3.Connection, now: int) -> list[StreamMessage]:
            def choose(offered: set[int], lane: int) -> list[int]:
                handed[:] = jobs.peek(c, now, stream, count, offered, lane)
                return _seqs(handed)

            offers.take(now, choose)
            if not handed:
                due[0] = jobs.next_due(c, now, stream)
            return list(handed)

        while True:
            waker.clear()
            try:
                peeked = await store.peek(peek)
                # A thread call ends even when cancelled meanwhile: its caller is
                # gone, so what it chose goes to the next reader, not to nobody.
                await anyio.lowlevel.checkpoint_if_cancelled()
            except BaseException:
                offers.forget(_seqs(handed))
                raise
            if peeked or anyio.current_time() >= deadline:
                return peeked
            with anyio.move_on_after(_wait_s(deadline, due[0], store.now_ms())):
                await waker.wait()

    async def reclaim(self, min_idle_ms: int, count: int) -> Reclaimed:
        stream, consumer = self._stream, self._consumer
        await self._store.write(jobs.purge)
        taken = await self._store.write(
            lambda c, now: jobs.reclaim(c, now, stream, consumer, min_idle_ms, count),
            undo=jobs.give_back,
        )
        # Each message carries its new lease token on ``delivery``: the ledger's
        # fence for every later transition of the job (nothing kept here).
        return Reclaimed(messages=tuple(m for m, _ in taken), complete=len(taken) < count)

    async def drop(self, ids: Sequence[str]) -> None:
        """Nothing to drop: a job's body lives in its row and is never deleted
        before the job is acknowledged."""



def _wait_s(deadline: float, due_ms: int | None, now_ms: int) -> float:
    """How long a read with nothing ready waits for a wake-up: until its deadline,
    a poll for other processes' publishes, or the next delayed job's due time,
    whichever comes first (a delayed job wakes the read itself: nothing commits
    when it becomes due)."""
    wait = min(POLL_S, max(0.0, deadline - anyio.current_time()))
    if due_ms is not None:
        wait = min(wait, max(0.0, (due_ms - now_ms) / 1000))
    return wait


def _seqs(messages: list[StreamMessage]) -> list[int]:
    return [seq for m in messages if (seq := jobs.seq_of(m.id)) is not None]
