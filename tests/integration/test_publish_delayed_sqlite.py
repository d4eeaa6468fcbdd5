"""Delayed and idempotent publishes on the embedded broker, on a real SQLite file
(issue 33). Boundaries run on a frozen clock handed to the broker; the tests of
a read waking at a due time, of two processes and of a restart use the real one.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

from relay.adapters.brokers import sqlite_backlog_reader
from relay.adapters.sqlite.broker import stream as stream_module
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.adapters.system import SystemClock
from relay.domain.priority import AGING_STEP_MS
from relay.domain.publication import InvalidPublication, Publication
from relay.entrypoints.cli import app
from tests.fakes import FakeClock
from tests.integration.broker_rows import read_held, rows
from tests.integration.racing import race

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]


def event(n: int) -> bytes:
    return json.dumps({"kind": "job", "n": n}).encode()


def stream_on(store: BrokerStore, consumer: str = "worker-1") -> SqliteEventStream:
    return SqliteEventStream(store, stream="events", group="relay", consumer=consumer)


async def test_a_delayed_job_is_not_read_before_its_time_and_is_read_at_it(
    store: BrokerStore, clock: FakeClock
) -> None:
    now = store.now_ms()
    publisher = SqliteEventPublisher(store, "events")
    [delayed] = await publisher.append([Publication(event(1), deliver_at_ms=now + 10_000)])
    stream = stream_on(store)
    assert await stream.read(10, 0) == []
    clock.advance(9.999)
    assert await stream.read(10, 0) == []
    clock.advance(0.001)
    [got] = await read_held(store, stream, 10)
    assert got.id == delayed
    assert got.payload == event(1)


async def test_a_time_in_the_past_is_now_and_the_bound_is_refused_before_writing(
    store: BrokerStore, path: Path
) -> None:
    now = store.now_ms()
    publisher = SqliteEventPublisher(store, "events")
    [past] = await publisher.append([Publication(event(1), deliver_at_ms=now - 60_000)])
    [got] = await stream_on(store).read(1, 0)
    assert got.id == past
    too_far = now + 366 * 86_400_000
    with pytest.raises(InvalidPublication, match="365 days"):
        await publisher.append(
            [Publication(event(2)), Publication(event(3), deliver_at_ms=too_far)]
        )
    assert rows(path, "SELECT count(*) FROM jobs") == [(1,)]  # nothing of the batch


async def test_a_delayed_job_ages_from_its_due_time_not_from_its_publish(
    store: BrokerStore, clock: FakeClock
) -> None:
    """Published low two minutes before it is due, it has not waited a minute when
    due: a critical job published then wins (aging counts from readiness)."""
    publisher = SqliteEventPublisher(store, "events")
    now = store.now_ms()
    [low] = await publisher.append(
        [Publication(event(1), priority="low", deliver_at_ms=now + 2 * AGING_STEP_MS)]
    )
    clock.advance(2 * AGING_STEP_MS / 1000)
    [critical] = await publisher.append([Publication(event(2), priority="critical")])
    stream = stream_on(store)
    assert [m.id for m in await read_held(store, stream, 1)] == [critical]
    assert [m.id for m in await read_held(store, stream, 1)] == [low]


async def test_the_backlog_counts_delayed_jobs_apart_until_they_are_due(
    store: BrokerStore, clock: FakeClock
) -> None:
    publisher = SqliteEventPublisher(store, "events")
    now = store.now_ms()
    await publisher.append([Publication(event(1)),
                            Publication(event(2), deliver_at_ms=now + 5_000),
                            Publication(event(3), deliver_at_ms=now + 9_000)])
    read = sqlite_backlog_reader(store, "events")
    assert await read() == (1, 0.0, 2)
    clock.advance(6)
    assert await read() == (2, 6.0, 1)  # the oldest, published 6 s ago


async def test_a_blocked_read_wakes_when_the_next_delayed_job_is_due(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing commits when a delayed job becomes due: the read itself wakes then,
    not the poll for other processes' publishes (made slower than the test here)."""
    monkeypatch.setattr(stream_module, "POLL_S", 30.0)
    store = BrokerStore(path, SystemClock())
    try:
        due = store.now_ms() + 400
        [delayed] = await SqliteEventPublisher(store, "events").append(
            [Publication(event(1), deliver_at_ms=due)]
        )
        with anyio.fail_after(5):
            got = await stream_on(store).read(1, 3_000)
        assert [m.id for m in got] == [delayed]
        assert store.now_ms() >= due
    finally:
        store.close()


async def test_delayed_jobs_survive_a_restart_of_the_broker(path: Path, clock: FakeClock) -> None:
    first = BrokerStore(path, clock)
    now = first.now_ms()
    ids = await SqliteEventPublisher(first, "events").append(
        [Publication(event(n), deliver_at_ms=now + 1_000 * n) for n in (1, 2, 3)]
    )
    first.close()  # the worker stops with all three waiting
    again = BrokerStore(path, clock)
    try:
        stream = stream_on(again)
        await stream.ensure_group()
        assert await stream.read(10, 0) == []
        clock.advance(3)
        assert [m.id for m in await read_held(again, stream, 10)] == ids
    finally:
        again.close()


_OLD_SCHEMA = """
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, created_ms INTEGER NOT NULL,
    priority INTEGER NOT NULL DEFAULT 2, payload BLOB,
    state TEXT NOT NULL DEFAULT 'ready' CHECK (state IN ('ready', 'leased', 'acked')),
    token TEXT, consumer TEXT, leased_ms INTEGER, deliveries INTEGER NOT NULL DEFAULT 0,
    expires_ms INTEGER
);
CREATE INDEX jobs_ready ON jobs (stream, priority, created_ms, seq) WHERE state = 'ready';
"""


async def test_a_file_of_the_previous_version_is_migrated_and_its_jobs_still_run(
    path: Path, clock: FakeClock
) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(_OLD_SCHEMA)
    conn.execute("INSERT INTO jobs (stream, created_ms, payload) VALUES ('events', 5, '{}')")
    conn.commit()
    conn.close()
    store = BrokerStore(path, clock)
    try:
        now = store.now_ms()
        await SqliteEventPublisher(store, "events").append(
            [Publication(event(1), deliver_at_ms=now + 1_000)]
        )
        stream = stream_on(store)
        assert [m.id for m in await read_held(store, stream, 10)] == ["5-1"]
        clock.advance(1)
        assert len(await read_held(store, stream, 10)) == 1
    finally:
        store.close()
    [(index,)] = rows(path, "SELECT sql FROM sqlite_master WHERE name = 'jobs_ready'")
    assert "ready_ms IS NULL" in index


async def test_a_key_published_twice_adds_one_job_and_answers_the_first_id(
    store: BrokerStore, clock: FakeClock, path: Path
) -> None:
    publisher = SqliteEventPublisher(store, "events", dedup_window_ns=60 * 10**9)
    [first] = await publisher.append([Publication(event(1), idempotency_key="order-1")])
    # the same key twice in one batch, and again later within the window
    again = await publisher.append([Publication(event(2), idempotency_key="order-1"),
                                    Publication(event(3), idempotency_key="order-1")])
    assert again == [first, first]
    clock.advance(59)
    assert await publisher.append([Publication(event(4), idempotency_key="order-1")]) == [first]
    assert rows(path, "SELECT count(*) FROM jobs") == [(1,)]
    clock.advance(1)  # the window is over: the key publishes again
    [later] = await publisher.append([Publication(event(5), idempotency_key="order-1")])
    assert later != first
    assert rows(path, "SELECT count(*) FROM jobs") == [(2,)]


async def test_expired_keys_are_pruned_by_later_keyed_publishes(
    store: BrokerStore, clock: FakeClock, path: Path
) -> None:
    publisher = SqliteEventPublisher(store, "events", dedup_window_ns=10**9)
    await publisher.append([Publication(event(n), idempotency_key=f"k{n}") for n in range(50)])
    clock.advance(2)
    await publisher.append([Publication(event(99), idempotency_key="fresh")])
    assert rows(path, "SELECT count(*) FROM occurrences") == [(1,)]


_PUBLISHER = """
import json, sys
from pathlib import Path
import anyio
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock
from relay.domain.publication import Publication

async def main() -> None:
    store = BrokerStore(Path(sys.argv[1]), SystemClock())
    publisher = SqliteEventPublisher(store, "events")
    go = Path(sys.argv[2])
    while not go.exists():  # both start publishing together
        await anyio.sleep(0.005)
    async with anyio.create_task_group() as tg:
        for n in range(10):
            async def one(n: int = n) -> None:
                payload = json.dumps({"from": sys.argv[3], "n": n}).encode()
                [mid] = await publisher.append([Publication(payload, idempotency_key="k-1")])
                print(mid, flush=True)
            tg.start_soon(one)
    store.close()

anyio.run(main)
"""


def test_two_processes_publishing_one_key_at_once_make_one_job(path: Path, tmp_path: Path) -> None:
    BrokerStore(path, SystemClock()).close()  # the file exists before both open it
    go = tmp_path / "go"
    answers = race(_PUBLISHER, [str(path)], go)
    assert len(answers) == 20
    assert len(set(answers)) == 1  # every publish answered with the one job's id
    assert rows(path, "SELECT count(*) FROM jobs") == [(1,)]


async def test_trace_of_a_delayed_job_says_until_when(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BrokerStore(path, SystemClock())
    try:
        [job] = await SqliteEventPublisher(store, "events").append(
            [Publication(event(1), deliver_at_ms=store.now_ms() + 3_600_000)]
        )
    finally:
        store.close()
    monkeypatch.setenv("RELAY_BROKER", "sqlite")
    monkeypatch.setenv("RELAY_BROKER_PATH", str(path))
    monkeypatch.setenv("REDIS_STREAM", "events")
    done = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(app, ["trace", job]))
    assert done.exit_code == 0, done.output
    assert "Delayed:      until " in done.stdout
    assert "Verdict:      delayed: deliverable from " in done.stdout


async def test_a_publish_given_up_on_and_retried_with_its_key_is_one_job(
    store: BrokerStore, path: Path
) -> None:
    """Failure row 360 on the embedded broker: the producer stops waiting (a timeout
    of its own) once its publish is handed to the writer, which commits it all the
    same; the retry with the same key answers that job's id."""
    publisher = SqliteEventPublisher(store, "events")
    one = [Publication(event(1), idempotency_key="charge-42")]
    with anyio.move_on_after(0) as scope:
        await publisher.append(one)
    assert scope.cancelled_caught
    [retried] = await publisher.append(one)
    assert rows(path, "SELECT created_ms || '-' || seq FROM jobs") == [(retried,)]


_CLAIMER = """
import sys
from pathlib import Path
import anyio
from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from relay.adapters.system import SystemClock

async def main() -> None:
    store = BrokerStore(Path(sys.argv[1]), SystemClock())
    stream = SqliteEventStream(store, stream="events", group="relay", consumer=sys.argv[2])
    until_ms = int(sys.argv[3])
    while store.now_ms() < until_ms:
        got = await stream.read(10, 200)  # blocks: wakes at the due time by itself
        wanted = [(jobs.seq_of(m.id), m.delivery) for m in got]
        held = await store.write(lambda c, now: jobs.hold(c, now, sys.argv[2], wanted))
        at = store.now_ms()
        for m in got:
            if jobs.seq_of(m.id) in held:
                print(m.id, at, flush=True)
    store.close()

anyio.run(main)
"""


async def test_three_worker_processes_run_each_delayed_job_once_and_none_early(
    path: Path,
) -> None:
    """Issue 33's "done when" on the embedded broker: three processes reading one
    file while 300 delayed jobs fall due: each is leased once, none before its time."""
    store = BrokerStore(path, SystemClock())
    try:
        due = store.now_ms() + 1_500
        ids = await SqliteEventPublisher(store, "events").append(
            [Publication(event(n), deliver_at_ms=due + n) for n in range(300)]
        )
    finally:
        store.close()
    claimed: dict[str, int] = {}
    twice: list[str] = []

    async def claimer(n: int) -> None:
        args = [str(path), f"worker-{n}", str(due + 2_500)]
        done = await anyio.run_process([sys.executable, "-c", _CLAIMER, *args], cwd=REPO)
        for line in done.stdout.decode().splitlines():
            message_id, at = line.split()
            if message_id in claimed:
                twice.append(message_id)
            claimed[message_id] = int(at)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for n in range(3):
                tg.start_soon(claimer, n)
    assert twice == []
    assert sorted(claimed) == sorted(ids)
    assert all(claimed[i] >= due + n for n, i in enumerate(ids))
