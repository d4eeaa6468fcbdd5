"""The embedded broker's group commit, on real SQLite files: its own failure cases.

A batch's callers share one ``BEGIN IMMEDIATE ... COMMIT`` and hear of it only
after the ``COMMIT`` returned. These tests hold the writer thread inside a step
of their own (a ``threading.Event`` it waits on) to line the queue up exactly:
no sleeps, every wait is for a condition.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.ledger import SqliteInvocationLedger
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.domain.outcome import BeginRequest, ClaimRequest, MessageContext, StreamMessage
from tests.fakes import FakeClock
from tests.integration.broker_fixtures import stream_on
from tests.integration.broker_rows import read_held, rows
from tests.integration.runtime_support import poll

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 10.0  # a bound on every wait, so a broken writer fails the test instead of hanging


class Hold:
    """A step that keeps the writer thread inside its transaction until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def step(self, conn: sqlite3.Connection, now_ms: int) -> None:
        self.entered.set()
        assert self.release.wait(WAIT_S)

    async def until_entered(self) -> None:
        assert await anyio.to_thread.run_sync(self.entered.wait, WAIT_S)


async def queued(store: BrokerStore, n: int) -> None:
    """Until ``n`` steps wait in the writer's queue (the queue is what is lined up)."""
    await poll(lambda: store._queue.qsize() >= n, WAIT_S, f"{n} queued steps")


async def idle_lease(store: BrokerStore, clock: FakeClock) -> str:
    """One job leased to a consumer that is gone, idle past the recovery threshold."""
    [mid] = await SqliteEventPublisher(store, "events").publish([(b'{"n": 1}', None)])
    await read_held(store, stream_on(store, "dead"), 1)
    clock.advance(61)
    return mid


async def test_a_reclaim_cancelled_while_queued_is_never_run_for_it(
    path: Path, store: BrokerStore, clock: FakeClock
) -> None:
    """Row 137: the recovery loop is cancelled (shutdown, a timeout) while its
    reclaim waits for the writer. The reclaim is dropped: the lease stays as it
    was, its delivery count untouched, and the next reclaim takes it at once."""
    mid = await idle_lease(store, clock)
    hold = Hold()
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.write, hold.step)
        await hold.until_entered()
        scope, gone = anyio.CancelScope(), anyio.Event()
        tg.start_soon(_reclaim_in, scope, store, stream_on(store, "gone"), gone)
        await queued(store, 1)
        scope.cancel()
        await gone.wait()
        hold.release.set()
    await store.write(lambda conn, now: None)  # the writer is past the dropped reclaim
    assert rows(path, "SELECT state, consumer, deliveries FROM jobs") == [("leased", "dead", 1)]
    [taken] = (await stream_on(store, "other").reclaim(60_000, 1)).messages
    assert (taken.id, taken.deliveries) == (mid, 2)


async def _reclaim_in(
    scope: anyio.CancelScope, store: BrokerStore, stream: SqliteEventStream, gone: anyio.Event
) -> None:
    """The reclaim step as ``SqliteEventStream.reclaim`` queues it (after its purge)."""
    consumer = stream.consumer

    def step(c: sqlite3.Connection, now: int) -> list[tuple[StreamMessage, str]]:
        return jobs.reclaim(c, now, "events", consumer, 60_000, 1)

    with scope:
        await store.write(step, undo=jobs.give_back)
        pytest.fail("the cancelled reclaim returned")
    gone.set()


async def test_a_reclaim_cancelled_after_it_ran_gives_the_lease_back(
    path: Path, store: BrokerStore, clock: FakeClock
) -> None:
    """Row 138: the writer has already run the reclaim (its transaction is open)
    when the recovery loop is cancelled. The reclaim commits, nobody hears of it,
    and the lease is given back in a transaction of its own: the job is ready
    again with that delivery uncounted, instead of leased to a reader that is
    gone until recovery finds it idle; it was delivered before, so it is read as
    a redelivery."""
    mid = await idle_lease(store, clock)
    first, second = Hold(), Hold()
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.write, first.step)
        await first.until_entered()
        scope, gone = anyio.CancelScope(), anyio.Event()
        tg.start_soon(_reclaim_in, scope, store, stream_on(store, "gone"), gone)
        await queued(store, 1)
        tg.start_soon(store.write, second.step)  # same batch, after the reclaim
        await queued(store, 2)
        first.release.set()
        await second.until_entered()  # the reclaim ran; its COMMIT waits for us
        scope.cancel()
        await gone.wait()
        second.release.set()
    await poll(lambda: rows(path, "SELECT state FROM jobs") == [("ready",)], WAIT_S,
               "the lease given back")
    assert rows(path, "SELECT consumer, token, deliveries FROM jobs") == [(None, None, 1)]
    [taken] = await stream_on(store, "other").read(1, 0)
    assert (taken.id, taken.deliveries, taken.reclaimed) == (mid, 2, True)


async def test_a_read_cancelled_in_its_thread_hands_the_job_to_the_next_reader(
    path: Path, store: BrokerStore
) -> None:
    """Row 176: a read only peeks, in a worker thread; cancelled there (its thread
    had already chosen the job and offered it to that reader), it withdraws the
    offer, so the next reader of this process is handed the job at once instead
    of after the offer lapses. The file was never written."""
    [mid] = await SqliteEventPublisher(store, "events").publish([(b'{"n": 1}', None)])
    scope, gone = anyio.CancelScope(), anyio.Event()
    reading = store._reading  # the one reading connection's lock: the read waits on it
    reading.acquire()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read_in, scope, stream_on(store, "gone"), gone)
            for _ in range(20):  # until the read waits in its thread
                await anyio.lowlevel.checkpoint()
            scope.cancel()
            reading.release()
            await gone.wait()
    finally:
        if reading.locked():
            reading.release()
    assert store._reader is not None  # the cancelled read's thread did peek
    assert rows(path, "SELECT state, consumer, deliveries FROM jobs") == [("ready", None, 0)]
    [taken] = await stream_on(store, "other").read(1, 0)
    assert (taken.id, taken.deliveries) == (mid, 1)


async def _read_in(
    scope: anyio.CancelScope, stream: SqliteEventStream, gone: anyio.Event
) -> None:
    with scope:
        await stream.read(1, 0)
        pytest.fail("the cancelled read returned")
    gone.set()


async def test_giving_back_leaves_a_job_taken_by_someone_else_alone(
    path: Path, store: BrokerStore
) -> None:
    """Row 138's fence: a give-back names the lease it undoes; a job reclaimed by
    another consumer meanwhile (a new token) keeps its new holder."""
    await SqliteEventPublisher(store, "events").publish([(b'{"n": 1}', None)])
    leased = await store.write(lambda c, now: jobs.claim(c, now, "events", "gone", 1))
    await store.write(lambda c, now: jobs.reclaim(c, now, "events", "other", 0, 1))
    assert await store.write(lambda c, now: jobs.give_back(c, now, leased)) == 0
    assert rows(path, "SELECT state, consumer, deliveries FROM jobs") == [("leased", "other", 2)]


async def test_a_ledger_step_cancelled_while_queued_still_commits(
    path: Path, store: BrokerStore
) -> None:
    """Row 137's limit: only a claim is dropped for a cancelled caller. A ledger
    call, once made, runs to its end whatever happens to its caller (the port's
    promise: a handler's result is never lost on its way to the ledger)."""
    await SqliteEventPublisher(store, "events").publish([(b'{"n": 1}', None)])
    reader = stream_on(store, "worker-1")
    [message] = await reader.read(1, 0)
    ledger = SqliteInvocationLedger(store)
    ctx = MessageContext(stream="events", group="relay", consumer="worker-1",
                         message_id=message.id, timestamp="2027-01-15T08:00:00.000Z",
                         delivery=message.delivery)
    request = BeginRequest(
        context=ctx, classification="matched:fn", token="t1",
        claims=(ClaimRequest(field="fn/h.run", max_attempts=3, lease_ms=60_000),),
        gates=("fn/h.run",),
    )
    hold = Hold()
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.write, hold.step)
        await hold.until_entered()
        scope, gone = anyio.CancelScope(), anyio.Event()

        async def begin() -> None:
            with scope:
                await ledger.begin(request)
            gone.set()

        tg.start_soon(begin)
        await queued(store, 1)
        scope.cancel()
        await gone.wait()
        hold.release.set()
    await store.write(lambda conn, now: None)  # the writer is past the begin
    fields = {f for (f,) in rows(path, "SELECT field FROM ledger")}
    assert "fn/h.run" in fields  # the claim landed although its caller was gone


_FULL_DISK = """
import json, resource, signal, sys, anyio
from pathlib import Path
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.adapters.system import SystemClock

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG

async def main() -> None:
    path = Path(sys.argv[1])
    store = BrokerStore(path, SystemClock())
    publisher = SqliteEventPublisher(store, "events")
    await publisher.publish([(b'{"n": %d}' % i, None) for i in range(3)])
    wal = path.with_name(path.name + "-wal")
    before = store.commits
    # The disk is full: no file may grow (the WAL only grows until a checkpoint).
    resource.setrlimit(resource.RLIMIT_FSIZE, (wal.stat().st_size, resource.RLIM_INFINITY))
    stream = SqliteEventStream(store, stream="events", group="relay", consumer="w")
    errors = []
    async def call(what, fn):
        try:
            await fn()
            errors.append([what, "answered"])
        except Exception as exc:
            errors.append([what, f"{type(exc).__name__}: {exc}"])
    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "read", lambda: stream.read(3, 0))
        tg.start_soon(call, "publish", lambda: publisher.publish([(b'{"n": 9}', None)]))
        tg.start_soon(call, "publish", lambda: publisher.publish([(b'{"n": 8}', None)]))
    commits = store.commits - before
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    after = len(await publisher.publish([(b'{"n": 7}', None)]))  # room again: it commits
    store.close()
    print(json.dumps({"errors": sorted(errors), "commits_while_full": commits, "after": after}))

anyio.run(main)
"""


def test_a_batch_whose_commit_fails_fails_every_caller_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """Row 139: the disk is full when a batch commits (``RLIMIT_FSIZE`` in a process
    of its own: the WAL cannot grow, so the ``COMMIT`` fails). Every caller of the
    batch gets one line naming the failure, none is told its change happened, the
    file holds exactly what it held before, and once there is room the broker
    goes on committing. A read, which writes nothing, is answered meanwhile."""
    path = tmp_path / "broker.sqlite3"
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(path)],
        check=True, capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["errors"][2] == ["read", "answered"]  # a read writes nothing
    assert [what for what, _ in report["errors"][:2]] == ["publish", "publish"]
    for _, error in report["errors"][:2]:
        assert error.startswith("DependencyUnavailable: sqlite broker "), error
        assert "\n" not in error
    assert report["commits_while_full"] == 0
    assert report["after"] == 1
    # No publish landed while full (3 before, 1 after), no delivery was counted.
    assert rows(path, "SELECT sum(deliveries), count(*) FROM jobs WHERE state = 'ready'") == [
        (0, 4)
    ]

