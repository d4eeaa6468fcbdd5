"""The embedded ledger's batched calls on a real file (issue 29 item 2, issue 35
item 12): ``begin_many`` / ``finish_many`` are one writer step each, a delivery
the broker no longer holds is answered ``lost``, and a transaction SQLite rolls
back by itself (a full file) fails every caller with nothing half committed."""

from __future__ import annotations

import sqlite3
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.ledger import SqliteInvocationLedger
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.domain.errors import DependencyUnavailable
from relay.domain.invocation import Complete
from relay.domain.outcome import (
    AttemptReport,
    BeginRequest,
    ClaimRequest,
    FinishRequest,
    MalformedRequest,
    MessageContext,
    StreamMessage,
)
from tests.fakes import FakeClock
from tests.integration.broker_fixtures import stream_on
from tests.integration.broker_rows import read_held, rows
from tests.integration.broker_world import BrokerWorld
from tests.integration.runtime_support import poll

pytestmark = pytest.mark.anyio

A = "fn/h.run"
REPO = Path(__file__).resolve().parents[2]
SIGKILLED = -9


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_900_000_000.0)


def ctx(m: StreamMessage, consumer: str) -> MessageContext:
    return MessageContext(stream="events", group="relay", consumer=consumer, message_id=m.id,
                          timestamp="2030-03-17T17:46:40.000Z", delivery=m.delivery)


def begin_req(m: StreamMessage, consumer: str, attempts: int = 3) -> BeginRequest:
    return BeginRequest(
        context=ctx(m, consumer), classification="matched:fn", token=f"inv-{m.id}",
        claims=(ClaimRequest(field=A, max_attempts=attempts, lease_ms=60_000),), gates=(A,),
    )


def finish_req(m: StreamMessage, consumer: str, report: AttemptReport) -> FinishRequest:
    return FinishRequest(context=ctx(m, consumer), token=f"inv-{m.id}", reports=(report,),
                         gates=(A,))


async def publish(store: BrokerStore, n: int, payload: bytes = b"{}") -> list[str]:
    return [
        await store.write(lambda c, now: jobs.publish(c, now, "events", payload, 2), wakes=True)
        for _ in range(n)
    ]


async def test_a_batch_is_one_step_and_a_delivery_taken_over_is_lost(
    path: Path, store: BrokerStore, clock: FakeClock
) -> None:
    """``begin_many`` claims every member in one transaction; a member whose job
    another consumer took over (a new token) is answered ``lost`` and nothing of
    it is written; ``finish_many`` acknowledges the rest in one transaction."""
    await publish(store, 4)
    got = await read_held(store, stream_on(store, "w"), 4)
    leased = dict(rows(path, "SELECT seq, token FROM jobs WHERE state = 'leased'"))
    assert [m.delivery for m in got] == [leased[jobs.seq_of(m.id)] for m in got]
    clock.advance(61)
    [taken] = (await stream_on(store, "other").reclaim(60_000, 1)).messages
    commits = store.commits
    begun = await SqliteInvocationLedger(store).begin_many([begin_req(m, "w") for m in got])
    assert store.commits == commits + 1
    assert [r.lost for r in begun] == [m.id == taken.id for m in got]
    assert rows(path, "SELECT count(*) FROM ledger WHERE seq = ?", jobs.seq_of(taken.id)) == [(0,)]
    held = [m for m in got if m.id != taken.id]
    report = AttemptReport(field=A, attempt=1, transition=Complete(), error="")
    settled = await SqliteInvocationLedger(store).finish_many(
        [finish_req(m, "w", report) for m in held]
    )
    assert store.commits == commits + 2
    assert all(s.acknowledged for s in settled)
    states = dict(rows(path, "SELECT seq, state FROM jobs"))
    assert sorted(states.values()) == ["acked", "acked", "acked", "leased"]
    assert states[jobs.seq_of(taken.id)] == "leased"


async def test_a_read_only_peeks_and_the_begin_leases_and_claims_in_one_commit(
    tmp_path: Path, path: Path, store: BrokerStore, clock: FakeClock
) -> None:
    """Rows 174-175: a read writes nothing (the jobs stay ready, no delivery
    counted), and a second reader of the same process is handed other jobs. The
    begin leases each job with its delivery handle and claims its invocation in
    one transaction: one durable commit for both. A reader of another process
    (its own writer on the same file) that begins the same jobs first wins them:
    this begin answers ``lost`` for each and writes nothing of them, and this
    process moves off the head of the queue (its lane)."""
    await publish(store, 4)
    a, b = stream_on(store, "a"), stream_on(store, "b")
    first = await a.read(2, 0)
    assert rows(path, "SELECT DISTINCT state, deliveries FROM jobs") == [("ready", 0)]
    second = await b.read(4, 0)
    assert {m.id for m in first}.isdisjoint(m.id for m in second)
    assert len(second) == 2  # the other two are offered to ``a``
    commits = store.commits
    begun = await SqliteInvocationLedger(store).begin_many([begin_req(m, "a") for m in first])
    assert store.commits == commits + 1
    assert [s.status for r in begun for s in r.statuses] == ["claimed", "claimed"]
    held = rows(path, "SELECT state, consumer, deliveries, token FROM jobs WHERE consumer = 'a'")
    assert sorted(held) == sorted(("leased", "a", 1, m.delivery) for m in first)
    other = BrokerStore(path, clock)  # another process's writer on the same file
    try:
        racer = [MessageContext(stream="events", group="relay", consumer="c",
                                message_id=m.id, timestamp="t", delivery=f"x.{jobs.seq_of(m.id)}.0")
                 for m in second]
        won = await SqliteInvocationLedger(other).begin_many([
            BeginRequest(context=r, classification="matched:fn", token="inv-c",
                         claims=(ClaimRequest(field=A, max_attempts=3, lease_ms=60_000),),
                         gates=(A,))
            for r in racer
        ])
        assert [r.lost for r in won] == [False, False]
    finally:
        other.close()
    lost = await SqliteInvocationLedger(store).begin_many([begin_req(m, "b") for m in second])
    assert [r.lost for r in lost] == [True, True]
    assert [r.statuses for r in lost] == [(), ()]
    for m in second:  # only the winner's classification and claim are recorded
        stamp = rows(path, "SELECT value FROM ledger WHERE seq = ? AND field = '@class'",
                     jobs.seq_of(m.id))
        assert stamp == [("matched:fn#inv-c",)]
    assert rows(path, "SELECT count(*) FROM jobs WHERE consumer = 'b'") == [(0,)]


async def test_a_full_file_mid_batch_fails_every_caller_and_commits_none_of_it(
    path: Path, store: BrokerStore
) -> None:
    """Row 170 (issue 35 item 12a, confirmed): on ``SQLITE_FULL`` SQLite rolls the
    whole transaction back by itself. A malformed event's DLQ insert hits the
    file's size limit; the ledger rule takes that for a failed DLQ write and the
    writer went on: before the fix the next step of the same batch (a publish)
    ran in autocommit and was on disk while its caller was told the batch
    failed. Now every caller of the batch fails and the file holds what it held."""
    [mid] = await publish(store, 1)
    [m] = await stream_on(store, "w").read(1, 0)

    def cap(c: sqlite3.Connection, _: int) -> None:  # the file may not grow
        pages = c.execute("PRAGMA page_count").fetchone()[0]
        c.execute(f"PRAGMA max_page_count = {pages}")

    await store.write(cap)
    ledger = SqliteInvocationLedger(store)
    hold = Hold()
    outcomes: dict[str, str] = {}

    async def call(name: str, fn: Callable[[], Awaitable[object]]) -> None:
        try:
            await fn()
            outcomes[name] = "answered"
        except DependencyUnavailable as exc:
            outcomes[name] = str(exc)

    request = MalformedRequest(context=ctx(m, "w"), reason="malformed", event="y" * 200_000)
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.write, hold.step)
        await anyio.to_thread.run_sync(hold.entered.wait, 10.0)
        tg.start_soon(call, "dlq", lambda: ledger.dead_letter_malformed(request))
        await poll(lambda: store._queue.qsize() >= 1, 10.0, "the DLQ step queued")
        tg.start_soon(call, "publish", lambda: publish(store, 1))
        await poll(lambda: store._queue.qsize() >= 2, 10.0, "the publish queued")
        hold.release.set()
    assert outcomes["dlq"].startswith("sqlite broker write failed: database or disk is full")
    assert outcomes["publish"] == outcomes["dlq"]
    assert rows(path, "SELECT seq, state, deliveries FROM jobs") == [(jobs.seq_of(mid), "ready", 0)]
    assert rows(path, "SELECT count(*) FROM dlq") == [(0,)]


class Hold:
    """A step that keeps the writer thread inside its transaction until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def step(self, conn: sqlite3.Connection, now_ms: int) -> None:
        self.entered.set()
        assert self.release.wait(10.0)


_DIES_WITH_A_BATCH_HALF_SETTLED = """
import os, signal, sys, threading, anyio
from pathlib import Path
from relay.adapters.sqlite.broker.ledger import SqliteInvocationLedger
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.adapters.system import SystemClock
from relay.domain.invocation import Complete, Exhaust
from relay.domain.outcome import (
    AttemptReport, BeginRequest, ClaimRequest, FinishRequest, MessageContext,
)

FIELD = "fn/h.run"

async def main():
    store = BrokerStore(Path(sys.argv[1]), SystemClock())
    stream = SqliteEventStream(store, stream="events", group="relay", consumer="worker-1")
    ledger = SqliteInvocationLedger(store)
    got = list(await stream.read(16, 0))
    ctxs = [MessageContext(stream="events", group="relay", consumer="worker-1",
                           message_id=m.id, timestamp="t", delivery=m.delivery) for m in got]
    claim = ClaimRequest(field=FIELD, max_attempts=3, lease_ms=300)
    await ledger.begin_many([BeginRequest(context=c, classification="matched:fn",
                                          token="tok-" + c.message_id, claims=(claim,),
                                          gates=(FIELD,)) for c in ctxs])

    def fin(i, c):  # every fourth job fails for good: dead-lettered by its finish
        t, error = (Exhaust(), "boom") if i % 4 == 0 else (Complete(), "")
        report = AttemptReport(field=FIELD, attempt=1, transition=t, error=error)
        return FinishRequest(context=c, token="tok-" + c.message_id, reports=(report,),
                             gates=(FIELD,))

    await ledger.finish_many([fin(i, c) for i, c in enumerate(ctxs[:8])])
    print(" ".join(c.message_id for c in ctxs[:8]), flush=True)
    entered, gate = threading.Event(), threading.Event()

    def hold(conn, now):
        entered.set()
        gate.wait(10)

    def die(conn, now):  # the second half's finish ran in this transaction: no COMMIT
        os.kill(os.getpid(), signal.SIGKILL)

    async with anyio.create_task_group() as tg:
        tg.start_soon(store.write, hold)
        await anyio.to_thread.run_sync(entered.wait, 10)
        tg.start_soon(ledger.finish_many, [fin(i, c) for i, c in enumerate(ctxs[8:], 8)])
        while store._queue.qsize() < 1:
            await anyio.sleep(0.001)
        tg.start_soon(store.write, die)
        while store._queue.qsize() < 2:
            await anyio.sleep(0.001)
        gate.set()

anyio.run(main)
"""


async def test_a_worker_killed_with_a_batch_half_settled_loses_nothing_and_dead_letters_once(
    tmp_path: Path, path: Path
) -> None:
    """Row 177 (issue 29): a worker process reads 16 jobs, begins them in one
    transaction, settles the first 8 (two of them dead-lettered) and is SIGKILLed
    inside the transaction settling the other 8 (two more exhausting). Nothing of
    that transaction is on disk. Restarted (same consumer: its leases are ready
    again), the real delivery path runs every job not settled exactly once more,
    none of the 8 settled again: lost 0, and exactly one DLQ entry per
    dead-lettered job."""
    seed = BrokerStore(path, FakeClock(1.0))
    try:
        ids = await publish(seed, 32, b'{"kind": "job"}')
    finally:
        seed.close()
    died = await anyio.run_process(
        [sys.executable, "-c", _DIES_WITH_A_BATCH_HALF_SETTLED, str(path)],
        cwd=REPO, check=False,
    )
    assert died.returncode == SIGKILLED, died.stderr.decode()[-400:]
    settled = died.stdout.decode().split()
    assert len(settled) == 8
    states = dict(rows(path, "SELECT seq, state FROM jobs"))
    assert sorted(states.values()).count("acked") == 8
    assert sorted(states.values()).count("leased") == 8  # the half whose settling died
    dead = [original for (original,) in rows(path, "SELECT original_id FROM dlq")]
    assert dead == [settled[0], settled[4]]
    world = BrokerWorld(path)  # the restart: same consumer name
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(world.run_loops)
            await poll(lambda: rows(path, "SELECT DISTINCT state FROM jobs") == [("acked",)],
                       30.0, "every job acknowledged")
            tg.cancel_scope.cancel()
    finally:
        world.close()
    ran = sorted(r.context for r in world.runtime.requests)
    assert len(ran) == len(set(ran)) == 24  # each job not settled before, once
    assert set(settled).isdisjoint(ran)
    assert set(ran) | set(settled) == set(ids)
    assert [o for (o,) in rows(path, "SELECT original_id FROM dlq")] == dead  # no duplicate


async def test_a_process_that_collided_reads_off_the_head_then_comes_back_to_it(
    store: BrokerStore,
) -> None:
    """Row 174: after a begin lost jobs to another process, this process's reads
    leave ``lane`` batches at the head to the others (never more than the queue
    holds beyond one batch; a head no longer than one batch, its newer half: row
    350), and after 16 begins without a collision it reads the head again, so a
    process left alone never leaves the head waiting."""
    ids = await publish(store, 5)
    offers = store.offers
    got: dict[int, list[str]] = {}
    for lane in range(4):

        def read(c: sqlite3.Connection, now: int, lane: int = lane) -> list[StreamMessage]:
            return jobs.peek(c, now, "events", 2, set(), lane)

        got[lane] = [m.id for m in await store.peek(read)]
    assert got == {0: ids[0:2], 1: ids[2:4], 2: ids[3:5], 3: ids[3:5]}

    def short(c: sqlite3.Connection, now: int, lane: int) -> list[str]:
        return [m.id for m in jobs.peek(c, now, "events", 8, set(), lane)]

    assert await store.peek(lambda c, now: short(c, now, 0)) == ids
    assert await store.peek(lambda c, now: short(c, now, 1)) == ids[2:]
    offers.begun([], collided=True)
    assert offers.lane in range(4)
    offers.lane = 3  # as if drawn
    for _ in range(15):
        offers.begun([], collided=False)
    assert offers.lane == 3
    offers.begun([], collided=False)
    assert offers.lane == 0
