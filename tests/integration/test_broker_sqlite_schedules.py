"""Schedule occurrences on the embedded broker's file: publish-if-new in one
transaction, across processes sharing the file and across restarts (no Docker,
no Redis). Each test names its row of ``docs/failure-semantics.md``."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.expiring import EXPIRED_BATCH
from relay.adapters.sqlite.broker.schedules import SqliteOccurrencePublisher, latest_published
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.db import db_path, open_db
from relay.adapters.system import SystemClock
from relay.domain import events as ev
from relay.domain import schedule
from relay.domain.errors import DependencyUnavailable
from relay.domain.execution import InvocationResult
from relay.entrypoints.cli import app
from tests.fakes import FakeClock
from tests.integration.broker_rows import rows
from tests.integration.broker_world import BrokerWorld

pytestmark = pytest.mark.anyio

AT = 1_900_000_000  # 2030-03-17T17:46:40Z
MINUTE = AT - 40  # 2030-03-17T17:46:00Z, a firing of "* * * * *"
REPO = Path(__file__).resolve().parents[2]
OCCURRENCES = 200


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(float(AT))


_PUBLISHER = """
import sys, anyio
from pathlib import Path
from relay.adapters.sqlite.broker.schedules import SqliteOccurrencePublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock
from relay.domain import schedule

async def main() -> None:
    store = BrokerStore(Path(sys.argv[1]), SystemClock())
    publisher = SqliteOccurrencePublisher(store, "events")
    ready, go, count = Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    ready.touch()
    while not go.exists():  # every process publishes the same occurrences at once
        await anyio.sleep(0.01)
    async def one(i: int) -> None:
        won = await publisher.publish(schedule.envelope("ticker", "jobs.tick", 1_900_000_000 + i))
        if won is not None:
            print(i, won, flush=True)
    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(one, i)
    store.close()

anyio.run(main)
"""


async def test_three_processes_sharing_the_file_publish_each_occurrence_once(
    tmp_path: Path, path: Path, store: BrokerStore
) -> None:
    """Row 129: three processes (three workers' schedulers) offer the same 200
    occurrences at once; the occurrence row and its job commit in one BEGIN
    IMMEDIATE transaction, so each occurrence wins once and is one job."""
    go = tmp_path / "go"
    won: list[str] = []

    async def publisher(n: int) -> None:
        ready = tmp_path / f"ready-{n}"
        args = [str(path), str(ready), str(go), str(OCCURRENCES)]
        done = await anyio.run_process([sys.executable, "-c", _PUBLISHER, *args], cwd=REPO)
        won.extend(line.split()[0] for line in done.stdout.decode().splitlines())

    async with anyio.create_task_group() as tg:
        for n in range(3):
            tg.start_soon(publisher, n)
        with anyio.fail_after(60):
            while not all((tmp_path / f"ready-{n}").exists() for n in range(3)):  # noqa: ASYNC110 - other processes
                await anyio.sleep(0.01)
        go.touch()
    assert sorted(won, key=int) == [str(i) for i in range(OCCURRENCES)]  # one winner each
    payloads = [json.loads(p) for (p,) in rows(path, "SELECT payload FROM jobs ORDER BY seq")]
    instants = sorted(p["scheduled_at"] for p in payloads)
    assert instants == sorted(schedule.instant(AT + i) for i in range(OCCURRENCES))
    assert rows(path, "SELECT count(*) FROM occurrences") == [(OCCURRENCES,)]


async def test_a_restarted_worker_does_not_publish_an_occurrence_again(
    path: Path, clock: FakeClock
) -> None:
    """Row 130: the occurrence's row is on disk with its job: a worker started
    again (a new process on the same file) finds it, within the 7-day window;
    past it, the occurrence may be published again (as a Redis key's TTL)."""
    occurrence = schedule.envelope("ticker", "jobs.tick", AT)
    first = BrokerStore(path, clock)
    try:
        entry = await SqliteOccurrencePublisher(first, "events").publish(occurrence)
    finally:
        first.close()
    assert entry is not None
    again = BrokerStore(path, clock)
    try:
        publisher = SqliteOccurrencePublisher(again, "events")
        assert await publisher.publish(occurrence) is None
        clock.advance(schedule.DEDUP_TTL_S - 1)
        assert await publisher.publish(occurrence) is None
        clock.advance(1)
        assert await publisher.publish(occurrence) is not None
    finally:
        again.close()
    assert rows(path, "SELECT count(*) FROM jobs") == [(2,)]
    assert rows(path, "SELECT count(*) FROM occurrences") == [(1,)]  # the expired row went


async def test_a_failed_publish_leaves_neither_the_job_nor_the_occurrence_row(
    path: Path, store: BrokerStore
) -> None:
    """Row 131: the job insert fails (a trigger stands in for a full disk): the
    transaction rolls back, so the occurrence is not remembered as published and
    the next tick publishes it; one clear error, no traceback text."""
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TRIGGER full BEFORE INSERT ON jobs BEGIN SELECT RAISE(ABORT, 'disk is full'); END"
    )
    conn.commit()
    publisher = SqliteOccurrencePublisher(store, "events")
    occurrence = schedule.envelope("ticker", "jobs.tick", AT)
    with pytest.raises(DependencyUnavailable, match="disk is full") as failed:
        await publisher.publish(occurrence)
    assert "\n" not in str(failed.value)
    assert rows(path, "SELECT count(*) FROM occurrences") == [(0,)]
    assert rows(path, "SELECT count(*) FROM jobs") == [(0,)]
    conn.execute("DROP TRIGGER full")
    conn.commit()
    conn.close()
    assert await publisher.publish(occurrence) is not None
    assert rows(path, "SELECT count(*) FROM jobs") == [(1,)]


async def test_latest_published_reads_each_schedules_newest_live_occurrence(
    store: BrokerStore, clock: FakeClock
) -> None:
    publisher = SqliteOccurrencePublisher(store, "events")
    for handler, at in (("jobs.a", AT - 60), ("jobs.a", AT), ("jobs.ab", AT + 60)):
        await publisher.publish(schedule.envelope("fn", handler, at))
    prefixes = [schedule.schedule_prefix("fn", h) for h in ("jobs.a", "jobs.ab", "jobs.c")]
    latest = await latest_published(store, "events", prefixes)
    assert latest == {
        prefixes[0]: schedule.occurrence_id("fn", "jobs.a", AT),
        prefixes[1]: schedule.occurrence_id("fn", "jobs.ab", AT + 60),
    }
    clock.advance(schedule.DEDUP_TTL_S)  # every row past its window: nothing remembered
    assert await latest_published(store, "events", prefixes) == {}


async def test_two_streams_in_one_file_each_get_their_occurrences_and_old_rows_count(
    store: BrokerStore, path: Path
) -> None:
    """Issue 35.4 on the embedded broker: the ``occurrences`` row is scoped by the
    stream, so two streams in one file each get every occurrence once; a live row
    of the previous layout (the bare occurrence id) still counts as published."""
    prod = SqliteOccurrencePublisher(store, "prod")
    staging = SqliteOccurrencePublisher(store, "staging")
    for at in range(AT, AT + 5 * 60, 60):
        occurrence = schedule.envelope("fn", "jobs.a", at)
        for publisher in (prod, staging, prod, staging):
            await publisher.publish(occurrence)
    found = rows(path, "SELECT stream, count(*) FROM jobs GROUP BY stream ORDER BY stream")
    assert found == [("prod", 5), ("staging", 5)]
    upgraded = schedule.envelope("fn", "jobs.a", AT + 3600)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO occurrences (id, message_id, expires_ms) VALUES (?, '1-1', ?)",
            (upgraded.occurrence_id, store.now_ms() + 60_000),
        )
    conn.close()
    assert await prod.publish(upgraded) is None
    prefix = schedule.schedule_prefix("fn", "jobs.a")
    assert await latest_published(store, "prod", [prefix]) == {prefix: upgraded.occurrence_id}


def test_schedule_ls_on_the_embedded_broker_reads_the_broker_file(
    tmp_path: Path, path: Path
) -> None:
    """``relay schedule ls`` with ``RELAY_BROKER=sqlite``: the last published
    occurrence comes from the file, with no Redis; a missing file is one line."""
    state = tmp_path / "state"
    db = open_db(db_path(state))
    db.upsert(
        "functions",
        "fn",
        {
            "name": "fn",
            "status": "ready",
            "schedules": [
                {"handler": "jobs.a", "cron": "0 3 * * *"},
                {"handler": "jobs.b", "cron": "0 4 * * *"},
            ],
        },
        "2030-03-17T00:00:00Z",
    )
    db.close()
    env = {
        "RELAY_STATE_DIR": str(state),
        "RELAY_RUN_DIR": str(tmp_path / "run"),
        "RELAY_BROKER": "sqlite",
        "RELAY_BROKER_PATH": str(path),
        "REDIS_URI": "",
    }
    missing = CliRunner().invoke(app, ["schedule", "ls"], env=env)
    assert missing.exit_code == 0
    assert missing.stderr.splitlines() == [
        f"relay: last published occurrences unknown: broker file {path} does not exist"
        " (RELAY_BROKER_PATH names it; relay start or relay publish creates it)"
    ]

    async def seed() -> None:
        s = await anyio.to_thread.run_sync(BrokerStore, path, SystemClock())  # the CLI's clock
        try:
            await SqliteOccurrencePublisher(s, "events").publish(
                schedule.envelope("fn", "jobs.a", AT)
            )
        finally:
            await anyio.to_thread.run_sync(s.close)

    anyio.run(seed)
    result = CliRunner().invoke(app, ["schedule", "ls"], env=env)
    assert result.exit_code == 0, result.output
    _, a, b = result.stdout.splitlines()
    assert a.startswith("fn/jobs.a")
    assert "2030-03-17T17:46:40Z" in a
    assert b.startswith("fn/jobs.b")
    assert "  -  " in b
    assert result.stderr == ""


async def test_overlap_skip_on_the_file_skips_while_an_earlier_occurrence_is_unfinished(
    path: Path, clock: FakeClock
) -> None:
    """Row 136: ``overlap: skip`` on the embedded broker, through the real
    dispatcher: while the earlier occurrence's job is delivered and not
    acknowledged (backing off after a failure), the next one is acknowledged
    without running; once the earlier one is terminal, the next runs."""
    field = "fn/jobs.tick"
    world = BrokerWorld(
        path,
        clock=clock,
        template={
            "schedules": [
                {"handler": "jobs.tick", "cron": "* * * * *", "overlap": "skip", "retries": 2}
            ]
        },
    )
    skipped: list[ev.OccurrenceSkipped] = []
    world.bus.subscribe(ev.OccurrenceSkipped, skipped.append)
    try:
        world.runtime.script[field] = InvocationResult(ok=False, error="slow and failing")
        first = await world.occurrences.publish(schedule.envelope("fn", "jobs.tick", MINUTE))
        second = await world.occurrences.publish(schedule.envelope("fn", "jobs.tick", MINUTE + 60))
        one, two = await world.stream.read(2, 0)
        assert (one.id, two.id) == (first, second)
        await world.dispatch(one)  # fails: backing off, still leased
        await world.dispatch(two)
        [skip] = skipped
        assert skip.occurrence_id == schedule.occurrence_id("fn", "jobs.tick", MINUTE + 60)
        assert len(world.runtime.requests) == 1
        states = dict(rows(path, "SELECT seq, state FROM jobs"))
        assert (states[jobs.seq_of(one.id)], states[jobs.seq_of(two.id)]) == ("leased", "acked")
        world.runtime.script.pop(field)
        clock.advance(61)  # past the first retry's backoff: recovery redelivers it
        [again] = (await world.stream.reclaim(30_000, 10)).messages
        await world.dispatch(again)
        third = await world.occurrences.publish(schedule.envelope("fn", "jobs.tick", MINUTE + 120))
        [three] = await world.stream.read(1, 0)
        assert three.id == third
        await world.dispatch(three)
        assert len(world.runtime.requests) == 3  # the retry, then the next occurrence ran
        assert len(skipped) == 1
        assert {s for (s,) in rows(path, "SELECT state FROM jobs")} == {"acked"}
    finally:
        world.close()


async def test_an_expired_occurrence_beyond_the_cleanup_batch_is_published_again(
    path: Path, store: BrokerStore, clock: FakeClock
) -> None:
    """Expiry is read per row, not left to the batched cleanup: with more expired
    rows than one publish deletes, each expired occurrence still counts as new."""
    publisher = SqliteOccurrencePublisher(store, "events", ttl_s=60)
    n = EXPIRED_BATCH * 2 + 1
    for i in range(n):
        assert await publisher.publish(schedule.envelope("fn", "jobs.a", AT + i)) is not None
    clock.advance(61)
    last = schedule.envelope("fn", "jobs.a", AT + n - 1)  # sorts after the batch deleted
    assert await publisher.publish(last) is not None
    assert await publisher.publish(last) is None
