"""Crashes and late workers on the embedded broker's file, with real processes
killed by SIGKILL: the process writing a transition dies mid-transaction, a worker
dies holding leases before its handler ran, and a slow worker's ACK comes after
its lease's idle time. Each test names its row of ``docs/failure-semantics.md``
(or of the table in ``docs/embedded-broker.md``); boundaries run on a frozen clock."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import anyio
import pytest

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.ledger import SqliteInvocationLedger
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from tests.fakes import FakeClock
from tests.integration.broker_rows import rows
from tests.integration.test_broker_sqlite import begin_request, finish_request

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
SIGKILLED = -9


async def publish(path: Path, n: int) -> list[str]:
    store = await anyio.to_thread.run_sync(BrokerStore, path, FakeClock())
    try:
        publisher = SqliteEventPublisher(store, "events")
        return await publisher.publish([(b'{"kind": "job", "n": %d}' % i, None) for i in range(n)])
    finally:
        await anyio.to_thread.run_sync(store.close)


_DIES_MID_TRANSACTION = """
import os, signal, sys, anyio
from pathlib import Path
from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock

def step(conn, now_ms):
    leased = jobs.claim(conn, now_ms, "events", "dying", 10)
    for message, _token in leased:
        seq = jobs.seq_of(message.id)
        conn.execute("INSERT INTO ledger (seq, field, value) VALUES (?, 'fn/h.run', 'running')",
                     (seq,))
    # more than the page cache holds: uncommitted pages spill into the WAL file
    conn.executemany("INSERT INTO ledger (seq, field, value) VALUES (?, ?, ?)",
                     ((0, f"pad{i}", "x" * 1024) for i in range(6000)))
    print(len(leased), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # before COMMIT

async def main():
    store = BrokerStore(Path(sys.argv[1]), SystemClock())
    await store.write(step)

anyio.run(main)
"""


async def test_a_process_killed_in_the_middle_of_a_transition_commits_none_of_it(
    tmp_path: Path,
) -> None:
    """Row 134: the writer process is SIGKILLed inside a claim's transaction (its
    leases and ledger rows written, pages spilled to the WAL, no COMMIT). The file
    opens clean (quick_check), and nothing of the transition is there: every job
    is ready, never delivered, with no token; the next claim leases them all."""
    path = tmp_path / "broker.sqlite3"
    ids = await publish(path, 10)
    died = await anyio.run_process(
        [sys.executable, "-c", _DIES_MID_TRANSACTION, str(path)], cwd=REPO, check=False
    )
    assert died.returncode == SIGKILLED
    assert died.stdout.decode().split() == ["10"]  # it got as far as the kill
    wal = path.with_name(path.name + "-wal")
    assert wal.stat().st_size > 2 * 1024 * 1024  # the uncommitted pages reached the disk
    store = await anyio.to_thread.run_sync(BrokerStore, path, FakeClock())  # quick_check
    try:
        assert rows(path, "SELECT count(*) FROM ledger") == [(0,)]
        states = rows(path, "SELECT state, deliveries, token, consumer FROM jobs")
        assert states == [("ready", 0, None, None)] * 10
        stream = SqliteEventStream(store, stream="events", group="relay", consumer="next")
        again = await stream.read(10, 0)
        assert sorted(m.id for m in again) == sorted(ids)
        assert {m.deliveries for m in again} == {1}
    finally:
        await anyio.to_thread.run_sync(store.close)


_DIES_HOLDING_LEASES = """
import os, signal, sys, anyio
from pathlib import Path
from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.adapters.system import SystemClock

async def main():
    store = BrokerStore(Path(sys.argv[1]), SystemClock())
    stream = SqliteEventStream(store, stream="events", group="relay", consumer="crashed-host")
    got = await stream.read(5, 0)
    wanted = [(jobs.seq_of(m.id), m.delivery) for m in got]  # leased as its begin would
    await store.write(lambda c, now: jobs.hold(c, now, "crashed-host", wanted))
    for message in got:
        print(message.id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # before any handler ran

anyio.run(main)
"""


async def test_a_worker_killed_holding_leases_has_them_taken_over_once_idle(
    tmp_path: Path,
) -> None:
    """Row 135: a worker process is SIGKILLed holding five leases, before any
    side effect. Another worker (another host: it cannot release them at its own
    start) takes none of them one millisecond before ``min_idle``, every one at
    ``min_idle``, with new tokens, and runs each as attempt 1 to its
    acknowledgment; the dead worker's tokens fence nothing."""
    path = tmp_path / "broker.sqlite3"
    ids = await publish(path, 5)
    died = await anyio.run_process(
        [sys.executable, "-c", _DIES_HOLDING_LEASES, str(path)], cwd=REPO, check=False
    )
    assert died.returncode == SIGKILLED
    assert sorted(died.stdout.decode().split()) == sorted(ids)
    leases = rows(path, "SELECT seq, token, leased_ms FROM jobs WHERE consumer = 'crashed-host'")
    assert len(leases) == 5
    dead_tokens = {seq: token for seq, token, _ in leases}
    leased_ms = max(ms for _, _, ms in leases)
    clock = FakeClock(leased_ms / 1000 + 59.999)
    store = await anyio.to_thread.run_sync(BrokerStore, path, clock)
    try:
        other = SqliteEventStream(store, stream="events", group="relay", consumer="other-host")
        await other.ensure_group()  # releases only its own host's leases
        assert (await other.reclaim(60_000, 10)).messages == ()
        clock.advance(0.001)
        taken = (await other.reclaim(60_000, 10)).messages
        assert sorted(m.id for m in taken) == sorted(ids)
        assert {(m.deliveries, m.reclaimed) for m in taken} == {(2, True)}
        ledger = SqliteInvocationLedger(store)
        for m in taken:
            seq = jobs.seq_of(m.id)
            assert seq is not None
            assert m.delivery != dead_tokens[seq]
            began = await ledger.begin(begin_request(other, m, f"inv-{seq}"))
            assert [(s.status, s.attempt) for s in began.statuses] == [("claimed", 1)]
            assert (await ledger.finish(finish_request(other, m, f"inv-{seq}"))).acknowledged
        for seq, token in dead_tokens.items():

            def stale(c: sqlite3.Connection, now: int, s: int = seq, t: str = token) -> bool:
                return jobs.acknowledge(c, now, s, t, 60) or jobs.touch(c, now, s, t)

            assert not await store.write(stale)
    finally:
        await anyio.to_thread.run_sync(store.close)
    assert rows(path, "SELECT DISTINCT state FROM jobs") == [("acked",)]


async def test_an_ack_delayed_past_min_idle_counts_until_the_job_is_taken_over(
    tmp_path: Path,
) -> None:
    """The sibling design's "ACK delayed past expiry", as this broker means it: a
    lease expires by idle time, so a finish arriving after ``min_idle`` while no
    one has taken the job over still acknowledges it (no other worker ran it);
    once another worker has reclaimed it, a late finish acknowledges nothing."""
    path = tmp_path / "broker.sqlite3"
    first, second = await publish(path, 2)
    clock = FakeClock()
    store = await anyio.to_thread.run_sync(BrokerStore, path, clock)
    try:
        slow = SqliteEventStream(store, stream="events", group="relay", consumer="slow")
        other = SqliteEventStream(store, stream="events", group="relay", consumer="other")
        ledger = SqliteInvocationLedger(store)
        got = await slow.read(2, 0)
        assert [m.id for m in got] == [first, second]
        for m in got:
            await ledger.begin(begin_request(slow, m, f"inv-{m.id}"))
        clock.advance(61)  # both leases idle past min_idle (60 s)
        assert (await ledger.finish(finish_request(slow, got[0], f"inv-{first}"))).acknowledged
        [taken] = (await other.reclaim(60_000, 10)).messages  # only the unacknowledged one
        assert taken.id == second
        # the slow worker still holds its own delivery of the job (its message)
        late = await ledger.finish(finish_request(slow, got[1], f"inv-{second}"))
        assert not late.acknowledged  # and it is told so (row 171)
        states = dict(rows(path, "SELECT seq, state FROM jobs"))
        assert (states[jobs.seq_of(first)], states[jobs.seq_of(second)]) == ("acked", "leased")
    finally:
        await anyio.to_thread.run_sync(store.close)
