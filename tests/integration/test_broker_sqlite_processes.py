"""Two worker processes on one broker file (``relay start --processes 2``, or two
hosts' workers sharing it): bursts are drained by both, without stalling.

Each "process" here is what one worker process has of the broker: its own
``BrokerStore`` (its own connections, writer thread, offers and lane) with a
stream and a ledger on it; SQLite's locking between two connections of one
process is the one between two processes. Each runs two consumers the way the
batched consumer does (read up to its free places, ``begin_many``, then
``finish_many``), while bursts of 8 jobs arrive together, as in the soak's
mid-batch variant."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import anyio
import pytest

from relay.adapters.sqlite.broker.ledger import SqliteInvocationLedger
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock
from relay.domain.invocation import Complete
from relay.domain.outcome import (
    CLAIMED,
    AttemptReport,
    BeginRequest,
    ClaimRequest,
    FinishRequest,
    MessageContext,
)
from tests.integration.broker_fixtures import stream_on
from tests.integration.broker_rows import rows
from tests.integration.runtime_support import poll

pytestmark = pytest.mark.anyio

A = "fn/h.run"
PLACES = 8  # each consumer's buffer: a burst fits one read


class Process:
    """One worker process's share of the broker file, and what it did."""

    def __init__(self, path: Path, name: str, attempts_s: float) -> None:
        self.name = name
        self.attempts_s = attempts_s  # what a batch's attempts take
        self.store = BrokerStore(path, SystemClock())
        self.ledger = SqliteInvocationLedger(self.store)
        self.ran: list[str] = []  # claimed here, so run here
        self.lost = 0  # begun too late: the other process held the job
        self.late = 0  # begun after the other process had settled the job

    async def consume(self, consumer: str, stop: anyio.Event) -> None:
        stream = stream_on(self.store, f"{self.name}-{consumer}")
        claim = ClaimRequest(field=A, max_attempts=3, lease_ms=60_000)
        report = AttemptReport(field=A, attempt=1, transition=Complete(), error="")
        while not stop.is_set():
            got = await stream.read(PLACES, 20)
            ctxs = [
                MessageContext(stream="events", group="relay", consumer=stream.consumer,
                               message_id=m.id, timestamp="", delivery=m.delivery)
                for m in got
            ]
            begun = await self.ledger.begin_many([
                BeginRequest(context=c, classification="matched:fn", token=f"{c.message_id}.t",
                             claims=(claim,), gates=(A,))
                for c in ctxs
            ])
            self.lost += sum(b.lost for b in begun)
            # A job the other process settled in the meantime is answered from its
            # ledger (nothing to run, as on Redis): not run twice.
            self.late += sum(not b.lost and b.statuses[0].status != CLAIMED for b in begun)
            held = [c for c, b in zip(ctxs, begun, strict=True) if b.statuses
                    and b.statuses[0].status == CLAIMED]
            if held and self.attempts_s:
                await anyio.sleep(self.attempts_s)
            settled = await self.ledger.finish_many([
                FinishRequest(context=c, token=f"{c.message_id}.t", reports=(report,), gates=(A,))
                for c in held
            ])
            assert all(s.acknowledged for s in settled)
            self.ran += [c.message_id for c in held]


async def drain(
    path: Path, bursts: int, burst: int, attempts_s: float
) -> tuple[list[str], list[Process]]:
    """``bursts`` bursts of ``burst`` jobs published by a third process (as `relay
    publish` is) while two processes of two consumers each drain the file; what
    was published and the two processes, once every job ran."""
    processes = [Process(path, "p1", attempts_s), Process(path, "p2", attempts_s)]
    producer = BrokerStore(path, SystemClock())
    publisher = SqliteEventPublisher(producer, "events")
    stop = anyio.Event()
    published: list[str] = []
    try:
        async with anyio.create_task_group() as tg:
            for process in processes:
                for consumer in ("c1", "c2"):
                    tg.start_soon(process.consume, consumer, stop)
            for _ in range(bursts):
                published += await publisher.publish([(b'{"kind": "job"}', None)] * burst)
                await anyio.sleep(0.01)  # the next burst: both are waiting again by then

            def drained() -> bool:
                return sum(len(p.ran) for p in processes) >= len(published)

            await poll(drained, timeout_s=30, what="every job run")
            stop.set()
    finally:
        for process in processes:
            process.store.close()
        producer.close()
    ran = Counter(m for p in processes for m in p.ran)
    assert sorted(ran) == sorted(published)
    assert set(ran.values()) == {1}  # none run twice
    assert rows(path, "SELECT DISTINCT state FROM jobs") == [("acked",)]
    return published, processes


async def test_two_processes_on_one_file_drain_bursts_together_without_stalling(
    path: Path,
) -> None:
    """Row 350: bursts of 8 arriving faster than one process runs them, while two
    processes (two consumers each) wait on the file, are drained by both: every
    job run exactly once, each process running a fair share, within the
    deadline. Both peek the same short head, so begins collide (answered
    ``lost``, nothing written); a collision costs one writer step, no job."""
    published, processes = await drain(path, bursts=40, burst=8, attempts_s=0.02)
    shares = [len(p.ran) for p in processes]
    assert min(shares) >= len(published) // 4, shares


async def test_two_processes_share_a_backlog_and_rarely_collide(path: Path) -> None:
    """Row 351: a backlog of 2,000 jobs drained by two processes is shared fairly
    (the write lock taken in turns, not left to SQLite's growing busy sleeps,
    under which one process ran 85% of it), and after a collision a process's
    lane leaves the other's batches alone: few begins wasted (about 20% before,
    4 to 9% now)."""
    published, processes = await drain(path, bursts=1, burst=2000, attempts_s=0.0)
    shares = [len(p.ran) for p in processes]
    assert min(shares) >= len(published) // 4, shares
    wasted = sum(p.lost + p.late for p in processes)
    assert wasted <= len(published) // 7, (wasted, shares)
