"""Redeliveries on the embedded broker's real file (issue 35 item 3, rows 172-173):
a job delivered more than once is a redelivery (``reclaimed``, ``deliveries`` > 1)
whichever way it came back, and an ``overlap: skip`` occurrence waiting out a
retry backoff is never acknowledged by the overlap rule without its DLQ entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.domain import events as ev
from relay.domain import schedule
from relay.domain.execution import InvocationResult
from tests.fakes import FakeClock
from tests.integration.broker_fixtures import stream_on
from tests.integration.broker_rows import read_held, rows
from tests.integration.broker_world import BrokerWorld

pytestmark = pytest.mark.anyio

AT = 1_900_000_000
MINUTE = AT - 40  # a firing of "* * * * *"
FIELD = "fn/jobs.tick"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(float(AT))


async def publish_one(store: BrokerStore) -> str:
    return await store.write(lambda c, now: jobs.publish(c, now, "events", b"{}", 2), wakes=True)


async def test_a_job_released_at_a_restart_is_read_as_a_redelivery(store: BrokerStore) -> None:
    """Row 172: the restarted worker's release puts the lease back to ready; the
    next read of it is the job's second delivery, and says so."""
    mid = await publish_one(store)
    [first] = await read_held(store, stream_on(store, "w"), 1)
    assert (first.id, first.reclaimed, first.deliveries) == (mid, False, 1)
    restarted = stream_on(store, "w")
    await restarted.ensure_group()  # the previous process is gone: its leases are ready
    [again] = await restarted.read(1, 0)
    assert (again.id, again.reclaimed, again.deliveries) == (mid, True, 2)


async def test_a_job_given_back_after_a_takeover_is_still_a_redelivery(
    store: BrokerStore, clock: FakeClock
) -> None:
    """Row 172: a reclaim whose caller was cancelled gives its lease back (that
    delivery uncounted); the job had been delivered before, so the next read is a
    redelivery. A first claim given back was never delivered: read as a first."""
    mid = await publish_one(store)
    await read_held(store, stream_on(store, "dead"), 1)
    clock.advance(61)
    taken = await store.write(lambda c, now: jobs.reclaim(c, now, "events", "gone", 60_000, 1))
    assert await store.write(lambda c, now: jobs.give_back(c, now, taken)) == 1
    [again] = await stream_on(store, "w").read(1, 0)
    assert (again.id, again.reclaimed, again.deliveries) == (mid, True, 2)
    fresh = await publish_one(store)
    claimed = await store.write(lambda c, now: jobs.claim(c, now, "events", "gone", 1))
    assert await store.write(lambda c, now: jobs.give_back(c, now, claimed)) == 1
    [first] = await stream_on(store, "w").read(1, 0)
    assert (first.id, first.reclaimed, first.deliveries) == (fresh, False, 1)


async def test_a_restart_never_acknowledges_a_skip_occurrence_waiting_out_its_backoff(
    path: Path, clock: FakeClock
) -> None:
    """Row 173 (issue 35 item 3): occurrence B of an ``overlap: skip`` schedule ran
    while the earlier occurrence A was not delivered (A's first claim was given
    back), failed and backs off; the worker restarts, so B's lease is released
    to ready. Read again beside A (now delivered, so unfinished), B is a
    redelivery: the overlap rule does not apply to it, nothing acknowledges it
    while its ledger says backing off, and no DLQ entry is skipped. Before the
    fix B was read as a first delivery, skipped and acknowledged: lost."""
    template = {"schedules": [
        {"handler": "jobs.tick", "cron": "* * * * *", "overlap": "skip", "retries": 2}
    ]}
    world = BrokerWorld(path, clock=clock, template=template)
    try:
        world.runtime.script[FIELD] = InvocationResult(ok=False, error="failing")
        a = await world.occurrences.publish(schedule.envelope("fn", "jobs.tick", MINUTE))
        b = await world.occurrences.publish(schedule.envelope("fn", "jobs.tick", MINUTE + 60))
        taken = await world.store.write(lambda c, now: jobs.claim(c, now, "events", "gone", 1))
        [one] = await world.stream.read(1, 0)
        assert one.id == b
        assert await world.store.write(lambda c, now: jobs.give_back(c, now, taken)) == 1
        await world.dispatch(one)  # A was never delivered: B runs, fails, backs off
        assert len(world.runtime.requests) == 1
    finally:
        world.close()
    world = BrokerWorld(path, clock=clock, template=template)  # the restart
    skipped: list[ev.OccurrenceSkipped] = []
    world.bus.subscribe(ev.OccurrenceSkipped, skipped.append)
    try:
        await world.stream.ensure_group()
        first, again = await world.stream.read(2, 0)
        assert (first.id, first.reclaimed) == (a, False)
        assert (again.id, again.reclaimed) == (b, True)
        await world.dispatch(again)  # still in its backoff: held, not acknowledged
        [(state,)] = rows(path, "SELECT state FROM jobs WHERE seq = ?", jobs.seq_of(b))
        assert state == "leased"
        assert skipped == []
        assert rows(path, "SELECT count(*) FROM dlq") == [(0,)]
    finally:
        world.close()


async def test_an_occurrence_handed_out_and_not_begun_counts_as_delivered_for_overlap(
    path: Path, clock: FakeClock
) -> None:
    """Row 175: a read only peeks, so two occurrences of an ``overlap: skip``
    schedule read in one batch are both still ready when the later one is
    dispatched first. The earlier one was handed to this process's reader: it
    counts as delivered (as a Redis entry is pending from its read), so the later
    one is skipped instead of running beside it."""
    template = {"schedules": [
        {"handler": "jobs.tick", "cron": "* * * * *", "overlap": "skip", "retries": 2}
    ]}
    world = BrokerWorld(path, clock=clock, template=template)
    skipped: list[ev.OccurrenceSkipped] = []
    world.bus.subscribe(ev.OccurrenceSkipped, skipped.append)
    try:
        a = await world.occurrences.publish(schedule.envelope("fn", "jobs.tick", MINUTE))
        b = await world.occurrences.publish(schedule.envelope("fn", "jobs.tick", MINUTE + 60))
        one, two = await world.stream.read(2, 0)
        assert (one.id, two.id) == (a, b)
        assert rows(path, "SELECT DISTINCT state FROM jobs") == [("ready",)]
        await world.dispatch(two)  # before ``one`` is begun
        assert [s.occurrence_id for s in skipped] == [
            schedule.occurrence_id("fn", "jobs.tick", MINUTE + 60)
        ]
        assert world.runtime.requests == []
        await world.dispatch(one)
        assert len(world.runtime.requests) == 1
    finally:
        world.close()
