"""The embedded broker's failure table, on a real SQLite file (no Docker, no Redis).

Each test names its row of ``docs/failure-semantics.md``. Boundaries run on a
frozen clock (``FakeClock``) handed to the broker, never on sleeps.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import Process

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.ledger import SqliteInvocationLedger
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore, CorruptBroker
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.domain.errors import DependencyUnavailable
from relay.domain.invocation import Complete, Exhaust
from relay.domain.outcome import (
    AttemptReport,
    BeginRequest,
    ClaimRequest,
    FinishRequest,
    MessageContext,
    RenewRequest,
    StreamMessage,
)
from relay.domain.priority import AGING_STEP_MS
from tests.fakes import FakeClock
from tests.integration.broker_fixtures import stream_on
from tests.integration.broker_rows import read_held, rows

pytestmark = pytest.mark.anyio

A = "fn/h.run"
REPO = Path(__file__).resolve().parents[2]


def ctx(stream: SqliteEventStream, message: StreamMessage) -> MessageContext:
    """The call's context, with the delivery's handle the read put on the message
    (the fence of the job's lease)."""
    return MessageContext(stream="events", group="relay", consumer=stream.consumer,
                          message_id=message.id, timestamp="2027-01-15T08:00:00.000Z",
                          delivery=message.delivery)


def begin_request(stream: SqliteEventStream, message: StreamMessage, token: str) -> BeginRequest:
    return BeginRequest(
        context=ctx(stream, message), classification="matched:fn", token=token,
        claims=(ClaimRequest(field=A, max_attempts=3, lease_ms=60_000),), gates=(A,),
    )


def finish_request(stream: SqliteEventStream, message: StreamMessage, token: str) -> FinishRequest:
    report = AttemptReport(field=A, attempt=1, transition=Complete(), error="")
    return FinishRequest(context=ctx(stream, message), token=token, reports=(report,),
                         gates=(A,))


def state_of(path: Path, message_id: str) -> str:
    [(state,)] = rows(path, "SELECT state FROM jobs WHERE seq = ?", jobs.seq_of(message_id))
    return str(state)


async def publish(store: BrokerStore, n: int, priority: str | None = None) -> list[str]:
    publisher = SqliteEventPublisher(store, "events")
    return await publisher.publish([(json.dumps({"kind": "job", "n": i}).encode(), priority)
                                    for i in range(n)])


_CLAIMER = """
import sys, anyio
from pathlib import Path
from typing import Any
from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.adapters.system import SystemClock

async def main() -> None:
    store = BrokerStore(Path(sys.argv[1]), SystemClock())
    stream = SqliteEventStream(store, stream="events", group="relay", consumer=sys.argv[2])
    ready, go = Path(sys.argv[3]), Path(sys.argv[4])
    ready.touch()
    while not go.exists():  # all three start claiming together
        await anyio.sleep(0.01)
    empty = 0
    while empty < 3:
        got = await stream.read(1, 0)  # a peek: the job is leased by the hold (a begin)
        empty = 0 if got else empty + 1
        wanted = [(jobs.seq_of(m.id), m.delivery) for m in got]
        held = await store.write(lambda c, now: jobs.hold(c, now, sys.argv[2], wanted))
        for m in got:
            if jobs.seq_of(m.id) in held:
                print(m.id, flush=True)
    store.close()

anyio.run(main)
"""


async def test_competing_claimers_in_three_processes_never_share_a_job(
    tmp_path: Path, path: Path, store: BrokerStore
) -> None:
    """Row 70: three processes claim from one file at once (each read a peek, each
    lease the conditional hold a begin makes); BEGIN IMMEDIATE makes each lease
    exclusive: every job is leased exactly once, none is lost, and a process
    that lost a job to another answers it lost and reads on."""
    ids = await publish(store, 900)
    claimed: list[str] = []

    go = tmp_path / "go"

    async def claimer(n: int) -> None:
        args = [str(path), f"claimer-{n}", str(tmp_path / f"ready-{n}"), str(go)]
        done = await anyio.run_process([sys.executable, "-c", _CLAIMER, *args], cwd=REPO)
        claimed.extend(done.stdout.decode().split())

    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(claimer, n)
        with anyio.fail_after(60):
            while not all((tmp_path / f"ready-{n}").exists() for n in range(3)):  # noqa: ASYNC110 - other processes
                await anyio.sleep(0.01)
        go.touch()
    assert len(claimed) == len(set(claimed)) == 900
    assert set(claimed) == set(ids)
    consumers = rows(path, "SELECT count(DISTINCT consumer) FROM jobs WHERE state = 'leased'")
    assert consumers == [(3,)]


async def test_a_worker_whose_job_was_reassigned_cannot_acknowledge_or_renew_it(
    path: Path, store: BrokerStore, clock: FakeClock
) -> None:
    """Rows 71 and 171: worker A's lease idles out and B reclaims the job (a new token).
    A's late finish is still fenced at the invocation (its claim token is valid,
    so its result is recorded, as on Redis), but its acknowledgment and its lease
    renewal carry A's stale job token and change nothing; B settles the job."""
    [mid] = await publish(store, 1)
    a, b = stream_on(store, "a"), stream_on(store, "b")
    [got] = await a.read(1, 0)
    ledger_a = SqliteInvocationLedger(store)
    await ledger_a.begin(begin_request(a, got, "inv-a"))
    clock.advance(61)
    reclaimed = await b.reclaim(60_000, 10)
    [taken] = reclaimed.messages
    assert taken.id == got.id
    assert taken.delivery != got.delivery  # B's new lease token, on its message
    # A returns, holding its old delivery (its message, as a separate process would).
    renewed = await ledger_a.renew(RenewRequest(context=ctx(a, got), token="inv-a", field=A,
                                                attempt=1, lease_ms=60_000))
    assert renewed > 0  # the invocation claim is A's ...
    [(leased_ms,)] = rows(path, "SELECT leased_ms FROM jobs WHERE seq = ?", jobs.seq_of(mid))
    assert leased_ms == store.now_ms()  # ... the lease B took just now is untouched by A
    clock.advance(1)
    settled = await ledger_a.finish(finish_request(a, got, "inv-a"))
    # The rule found every invocation terminal, but A's token no longer fences the
    # job: its fenced ACK changed no row, so A is told it did not acknowledge (row
    # 171: it was told "acknowledged" before) ...
    assert not settled.acknowledged
    assert state_of(path, mid) == "leased"  # ... and the job is still B's
    [(token,)] = rows(path, "SELECT token FROM jobs WHERE seq = ?", jobs.seq_of(mid))
    assert token == taken.delivery
    late = await SqliteInvocationLedger(store).begin(begin_request(b, taken, "inv-b"))
    assert [s.status for s in late.statuses] == ["ok"]  # nothing runs again
    assert state_of(path, mid) == "acked"


async def test_a_lease_is_reclaimable_exactly_when_its_idle_time_is_reached(
    store: BrokerStore, clock: FakeClock
) -> None:
    """Row 72: one millisecond before ``min_idle`` the lease holds; at ``min_idle``
    recovery takes it; a renewal by the holder restarts the idle time."""
    [mid] = await publish(store, 1)
    holder, other = stream_on(store, "holder"), stream_on(store, "other")
    [held] = await read_held(store, holder, 1)
    clock.advance(59.999)
    assert (await other.reclaim(60_000, 10)).messages == ()
    ledger = SqliteInvocationLedger(store)
    await ledger.begin(begin_request(holder, held, "t1"))
    assert await ledger.renew(RenewRequest(context=ctx(holder, held), token="t1", field=A,
                                           attempt=1, lease_ms=60_000))
    clock.advance(59.999)
    assert (await other.reclaim(60_000, 10)).messages == ()  # renewed: idle from the renewal
    clock.advance(0.001)
    [taken] = (await other.reclaim(60_000, 10)).messages
    assert (taken.id, taken.deliveries, taken.reclaimed) == (mid, 2, True)


async def test_a_restart_makes_old_leases_ready_and_voids_their_tokens(
    path: Path, store: BrokerStore, clock: FakeClock
) -> None:
    """Row 73: a worker dies holding leases; its next process (same consumer name,
    the process lock guarantees the old one is gone) finds them ready again,
    leases them with new tokens, and the old tokens fence nothing."""
    ids = await publish(store, 3)
    old = stream_on(store, "host-1")
    first = await read_held(store, old, 3)
    assert len(first) == 3
    old_tokens = {jobs.seq_of(m.id) or 0: m.delivery for m in first}
    other = stream_on(store, "host-2")
    [kept] = await publish(store, 1)
    await read_held(store, other, 1)  # another host's lease is not ours to release
    restarted_store = BrokerStore(path, clock)
    try:
        restarted = stream_on(restarted_store, "host-1")
        await restarted.ensure_group()
        assert state_of(path, kept) == "leased"
        again = await read_held(restarted_store, restarted, 10)
        assert sorted(m.id for m in again) == sorted(ids)
        assert {m.deliveries for m in again} == {2}
        new_tokens = {jobs.seq_of(m.id) or 0: m.delivery for m in again}
        for seq, token in old_tokens.items():
            assert new_tokens[seq] != token
            def stale_ack(c: sqlite3.Connection, now: int, s: int = seq, t: str = token) -> bool:
                return jobs.acknowledge(c, now, s, t, 3600)

            assert not await store.write(stale_ack)
        assert {state_of(path, i) for i in ids} == {"leased"}
    finally:
        restarted_store.close()


def _damage(path: Path) -> None:
    """Overwrite the middle of the file (a table's pages), as a bad disk would."""
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 4096)


async def test_a_corrupt_file_is_refused_at_open_and_left_as_it_is(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Row 74: ``PRAGMA quick_check`` at open. A damaged database and a file that is
    no database at all each fail with one line naming the file; neither is
    recreated or changed."""
    damaged = tmp_path / "damaged.sqlite3"
    s = BrokerStore(damaged, clock)
    await publish(s, 3000)
    s.close()
    _damage(damaged)
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"not a database, but somebody's notes\n" * 200)
    for broken in (damaged, garbage):
        before = broken.read_bytes()
        with pytest.raises(CorruptBroker) as info:
            BrokerStore(broken, clock)
        message = str(info.value)
        assert message.startswith(f"broker file {broken} is corrupt (")
        assert "\n" not in message
        assert broken.read_bytes() == before


async def test_aging_a_low_job_waiting_three_minutes_is_claimed_before_a_fresh_critical(
    store: BrokerStore, clock: FakeClock
) -> None:
    """Row 75 (frozen clock): strict priority would starve ``low`` under a steady
    ``critical`` stream; after three minutes of waiting it is claimed first."""
    [low] = await publish(store, 1, "low")
    clock.advance(3 * AGING_STEP_MS / 1000)
    [critical] = await publish(store, 1, "critical")
    [normal] = await publish(store, 1)
    stream = stream_on(store)
    order = [m.id for m in await stream.read(1, 0)]
    order += [m.id for m in await stream.read(1, 0)]
    order += [m.id for m in await stream.read(1, 0)]
    assert order == [low, critical, normal]


async def test_a_critical_job_jumps_a_fresh_backlog(store: BrokerStore) -> None:
    """Row 75: without waiting, classes are strict."""
    await publish(store, 50, "low")
    await publish(store, 50)
    [critical] = await publish(store, 1, "critical")
    [first] = await stream_on(store).read(1, 0)
    assert first.id == critical


async def test_arrival_faster_than_processing_grows_the_table_not_the_leases(
    path: Path, store: BrokerStore
) -> None:
    """Row 76: leases are taken only for free slots (the read's ``count``); the rest
    stays on disk, ready."""
    await publish(store, 2000)
    stream = stream_on(store)
    assert len(await read_held(store, stream, 4)) == 4
    counts = dict(rows(path, "SELECT state, count(*) FROM jobs GROUP BY state"))
    assert counts == {"leased": 4, "ready": 1996}


async def test_retention_deletes_only_acknowledged_jobs_past_their_ledger_retention(
    path: Path, store: BrokerStore, clock: FakeClock
) -> None:
    """Row 77: an acknowledged job and its ledger rows go once ``LEDGER_RETENTION``
    is over; ready and leased jobs (however old) are never deleted."""
    done, leased, ready = await publish(store, 3)
    stream = stream_on(store)
    got = await read_held(store, stream, 2)
    assert [m.id for m in got] == [done, leased]
    ledger = SqliteInvocationLedger(store, acked_ttl_s=3600)
    await ledger.begin(begin_request(stream, got[0], "t1"))
    assert (await ledger.finish(finish_request(stream, got[0], "t1"))).acknowledged
    clock.advance(3599)
    await stream.reclaim(10**12, 10)  # a recovery step runs the retention step
    assert rows(path, "SELECT count(*) FROM ledger WHERE seq = ?", jobs.seq_of(done)) != [(0,)]
    clock.advance(1)
    await stream.reclaim(10**12, 10)
    left = {jobs.message_id(c, s) for c, s in rows(path, "SELECT created_ms, seq FROM jobs")}
    assert left == {leased, ready}
    assert rows(path, "SELECT count(*) FROM ledger WHERE seq = ?", jobs.seq_of(done)) == [(0,)]


async def test_concurrent_steps_share_commits_and_each_answers_after_its_commit(
    path: Path, store: BrokerStore
) -> None:
    """Row 78: group commit. 64 concurrent publishers are answered only with ids
    already committed (another connection sees every one of them at once), in
    fewer transactions than steps."""
    results: list[str] = []
    before = store.commits

    async def one() -> None:
        [mid] = await publish(store, 1)
        seen = rows(path, "SELECT count(*) FROM jobs WHERE seq = ?", jobs.seq_of(mid))
        assert seen == [(1,)]  # committed before this caller learned its id
        results.append(mid)

    async with anyio.create_task_group() as tg:
        for _ in range(64):
            tg.start_soon(one)
    assert len(set(results)) == 64
    assert store.commits - before < 64


async def test_closing_finishes_queued_steps_and_refuses_later_ones(
    path: Path, clock: FakeClock
) -> None:
    """Row 79: bounded shutdown. Steps queued before ``close`` are committed and
    answered; a step after it fails with one line instead of hanging."""
    s = BrokerStore(path, clock)
    publisher = SqliteEventPublisher(s, "events")
    answered: list[str] = []

    async def one(i: int) -> None:
        answered.extend(await publisher.publish([(b'{"n": %d}' % i, None)]))

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
        await anyio.lowlevel.checkpoint()
        await anyio.to_thread.run_sync(s.close)
    assert len(answered) == 20
    assert rows(path, "SELECT count(*) FROM jobs") == [(20,)]
    with pytest.raises(DependencyUnavailable, match="sqlite broker is closed"):
        await publisher.publish([(b"{}", None)])


async def test_sigkill_and_restart_of_a_worker_loses_nothing_and_never_overlaps_a_job(
    tmp_path: Path, path: Path, store: BrokerStore
) -> None:
    """Row 80: 1,000 jobs through Relay's real delivery path on the broker file; the
    worker process is SIGKILLed mid-stream and started again. Every job ends
    acknowledged with its invocation ``ok`` (lost = 0), and no job ever had two
    runs open at once (a run cut by the kill ends at the kill)."""
    ids = await publish(store, 1000)
    journal = tmp_path / "journal"
    journal.touch()

    errors = (tmp_path / "worker.err").open("ab")  # closed after the second worker

    async def start() -> Process:
        return await anyio.open_process(
            [sys.executable, "-m", "tests.integration.broker_world", str(path), str(journal)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=errors,
        )

    def ends() -> int:
        return journal.read_text().count("\nend ")

    async def until(predicate: Callable[[], bool]) -> None:
        with anyio.fail_after(90):
            while not predicate():  # noqa: ASYNC110 - another process writes what we poll
                await anyio.sleep(0.05)

    first = await start()
    try:
        await until(lambda: ends() >= 300)
    finally:
        first.kill()
        await first.wait()
        await first.aclose()
    killed_pid = str(first.pid)
    assert 300 <= ends() < 1000, "the kill came mid-stream"
    second = await start()
    try:
        def acked() -> bool:
            return rows(path, "SELECT count(*) FROM jobs WHERE state != 'acked'") == [(0,)]

        await until(acked)
    finally:
        second.terminate()
        await second.wait()
        await second.aclose()
        errors.close()
    markers = dict(rows(path, "SELECT seq, value FROM ledger WHERE field = ?", "fn/h.run"))
    assert len(markers) == 1000
    assert set(markers.values()) == {"ok"}
    assert rows(path, "SELECT count(*) FROM dlq") == [(0,)]
    open_runs: dict[str, str] = {}  # message id -> pid of the run not yet ended
    runs_per_job: dict[str, int] = {}
    cut = 0
    for line in journal.read_text().splitlines():
        what, mid, pid = line.split()
        if pid != killed_pid and not cut:
            # the first line of the new process: the killed one is gone, and its
            # open runs ended with it
            cut = sum(1 for p in open_runs.values() if p == killed_pid) or -1
            open_runs = {m: p for m, p in open_runs.items() if p != killed_pid}
        if what == "start":
            assert mid not in open_runs, f"{mid} ran twice at once"
            open_runs[mid] = pid
            runs_per_job[mid] = runs_per_job.get(mid, 0) + 1
        elif what == "end":
            assert open_runs.pop(mid) == pid
    assert set(runs_per_job) == set(ids)  # lost = 0
    assert sum(runs_per_job.values()) <= 1000 + 16  # reruns only of runs in flight at the kill


async def test_a_failing_step_is_its_callers_alone_and_leaves_nothing_behind(
    path: Path, store: BrokerStore
) -> None:
    """Row 78: a step that raises half-way through a group commit (after its first
    write) is rolled back and reported to its caller only; the steps committed
    with it in the same batch are committed once each."""

    def half_then_fail(conn: sqlite3.Connection, now_ms: int) -> None:
        jobs.publish(conn, now_ms, "events", b'{"half": true}', 2)
        raise ValueError("this step fails after its first write")

    failures: list[str] = []

    async def bad() -> None:
        try:
            await store.write(half_then_fail)
        except ValueError as exc:
            failures.append(str(exc))

    async with anyio.create_task_group() as tg:
        for i in range(30):
            tg.start_soon(bad if i == 10 else publish, *(() if i == 10 else (store, 1)))
    assert failures == ["this step fails after its first write"]
    assert rows(path, "SELECT count(*) FROM jobs") == [(29,)]
    assert rows(path, "SELECT count(*) FROM jobs WHERE payload LIKE '%half%'") == [(0,)]


async def test_a_terminal_job_is_never_leased_reclaimed_or_acknowledged_again(
    path: Path, store: BrokerStore, clock: FakeClock
) -> None:
    """Row 86: terminal-state invariants. Once acknowledged (completed or
    dead-lettered), a job is never read, reclaimed or acknowledged again, however
    long it sits, and a late acknowledgment with its old token changes nothing."""
    done, exhausted = await publish(store, 2)
    stream = stream_on(store)
    done_message, exhausted_message = await stream.read(2, 0)
    ledger = SqliteInvocationLedger(store)
    await ledger.begin(begin_request(stream, done_message, "t1"))
    assert (await ledger.finish(finish_request(stream, done_message, "t1"))).acknowledged
    request = BeginRequest(
        context=ctx(stream, exhausted_message), classification="matched:fn", token="t2",
        claims=(ClaimRequest(field=A, max_attempts=1, lease_ms=60_000),), gates=(A,),
    )
    await ledger.begin(request)
    report = AttemptReport(field=A, attempt=1, transition=Exhaust(), error="boom")
    settled = await ledger.finish(FinishRequest(context=ctx(stream, exhausted_message), token="t2",
                                                reports=(report,), gates=(A,)))
    assert settled.acknowledged
    assert [d.field for d in settled.dead_lettered] == [A]
    states = rows(path, "SELECT state, expires_ms FROM jobs ORDER BY seq")
    clock.advance(3600)
    assert await stream.read(10, 0) == []
    assert (await stream.reclaim(0, 10)).messages == ()
    for message_id in (done, exhausted):
        seq = jobs.seq_of(message_id) or 0

        def late_ack(c: sqlite3.Connection, now: int, s: int = seq) -> bool:
            return jobs.acknowledge(c, now, s, "any-token", 3600)

        assert not await store.write(late_ack)
    assert rows(path, "SELECT state, expires_ms FROM jobs ORDER BY seq") == states
    assert rows(path, "SELECT count(*) FROM dlq") == [(1,)]


async def test_the_broker_file_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """The file holds event payloads: 0600 with its ``-wal``/``-shm``, and the
    directories Relay creates 0700, as for the state database."""
    old = os.umask(0o022)
    try:
        path = tmp_path / "new" / "dir" / "broker.sqlite3"
        s = BrokerStore(path, FakeClock())
        try:
            await publish(s, 1)
            modes = {p.name: p.stat().st_mode & 0o777 for p in path.parent.iterdir()}
        finally:
            s.close()
    finally:
        os.umask(old)
    assert modes == {"broker.sqlite3": 0o600, "broker.sqlite3-wal": 0o600,
                     "broker.sqlite3-shm": 0o600}
    assert {(tmp_path / d).stat().st_mode & 0o777 for d in ("new", "new/dir")} == {0o700}
