"""A schedule occurrence through the dispatcher: a second kind of message that
bypasses matching and takes every other step of an event."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from relay.domain import events as ev
from relay.domain import schedule
from relay.domain.durations import SECOND
from relay.domain.execution import InvocationResult
from relay.domain.message_outcomes import Ended
from relay.domain.outcome import StreamMessage
from tests.unit.delivery_world import World, rule

pytestmark = pytest.mark.anyio

AT = int(datetime(2027, 1, 15, 3, 0, tzinfo=UTC).timestamp())  # 5 h before the clock
FIELD = "jobs/jobs.nightly.handler"


def nightly(**extra: Any) -> dict[str, Any]:
    return {"handler": "jobs.nightly.handler", "cron": "0 3 * * *", **extra}


def world_with(*schedules: dict[str, Any], events: list[Any] | None = None) -> World:
    world = World()
    world.function("jobs", {"schedules": list(schedules), "events": events or []})
    return world


async def publish(world: World, at_s: int = AT, handler: str = "jobs.nightly.handler") -> str:
    entry = await world.publisher.publish(schedule.envelope("jobs", handler, at_s))
    assert entry is not None
    return entry


async def deliver_next(world: World) -> Any:
    [message] = await world.stream.read(1, 0)
    return await world.dispatch(message)


async def test_an_occurrence_runs_exactly_its_handler_with_the_schedule_payload() -> None:
    world = world_with(nightly(timeout="20s"))
    # an event rule that would match the envelope must not run: matching is bypassed
    world.function("greedy", {"events": [rule("events.any.handler", {"source": {"exists": True}})]})
    await publish(world)
    report = await deliver_next(world)
    assert (report.acknowledged, report.outcome) == (True, "completed")
    [request] = world.runtime.requests
    assert (request.function, request.handler) == ("jobs", "jobs.nightly.handler")
    assert request.event == b'{"source":"relay.schedule","scheduled_at":"2027-01-15T03:00:00Z"}'
    assert request.timeout_ns == 20 * SECOND
    # no event counters: an occurrence has no matched/unmatched class
    assert world.of(ev.EventClassified) == []
    assert world.ledger.hashes[report.message_id]["@class"].startswith(
        "schedule:jobs:jobs.nightly.handler:2027-01-15T03:00:00Z#"
    )


async def test_a_failing_occurrence_with_no_retries_dead_letters_its_envelope() -> None:
    world = world_with(nightly(retries=0))
    world.runtime.script[FIELD] = InvocationResult(ok=False, error="boom")
    await publish(world)
    report = await deliver_next(world)
    assert (report.acknowledged, report.outcome) == (True, "dead_lettered")
    assert len(world.runtime.requests) == 1
    [(_, entry)] = world.dlq.entries
    envelope = schedule.encode(schedule.envelope("jobs", "jobs.nightly.handler", AT))
    assert entry.event == envelope.decode()
    assert (entry.function, entry.handler, entry.handler_attempts) == (
        "jobs", "jobs.nightly.handler", 1,
    )  # fmt: skip


async def test_the_schedule_retries_apply() -> None:
    world = world_with(nightly(retries=1))
    world.runtime.script[FIELD] = InvocationResult(ok=False, error="boom")
    entry = await publish(world)
    first = await deliver_next(world)
    assert (first.acknowledged, first.outcome) == (False, "retrying")
    world.expire_deadlines(entry)
    second = await world.redeliver(entry)
    assert (second.acknowledged, second.outcome) == (True, "dead_lettered")
    assert len(world.runtime.requests) == 2


async def test_an_occurrence_of_a_removed_schedule_is_obsolete() -> None:
    world = world_with(nightly())
    await publish(world)
    world.function("jobs", {"events": [rule("jobs.nightly.handler", {"a": [1]})]})
    report = await deliver_next(world)
    assert (report.acknowledged, report.outcome) == (True, "obsolete")
    assert world.runtime.requests == []  # not even the event rule of the same name
    assert world.dlq.entries == []
    [obsolete] = world.of(ev.OccurrenceObsolete)
    assert obsolete.occurrence_id == "schedule:jobs:jobs.nightly.handler:2027-01-15T03:00:00Z"


async def test_an_occurrence_of_a_removed_function_is_obsolete() -> None:
    world = world_with(nightly())
    await publish(world)
    world.registry.drop("jobs")
    report = await deliver_next(world)
    assert (report.acknowledged, report.outcome) == (True, "obsolete")
    assert world.dlq.entries == []
    assert len(world.of(ev.OccurrenceObsolete)) == 1


async def test_an_occurrence_waits_for_an_unavailable_or_building_function() -> None:
    world = world_with(nightly())
    entry = await publish(world)
    world.registry.drop("jobs")
    world.registry.mark_unavailable("jobs")  # its template cannot be read right now
    report = await deliver_next(world)
    assert (report.acknowledged, report.outcome) == (False, "function_unavailable")
    world.function("jobs", {"schedules": [nightly()]}, image=None)  # back, still building
    again = await world.redeliver(entry)
    assert (again.acknowledged, again.outcome) == (False, "building")
    assert world.runtime.requests == []
    assert "jobs/jobs.nightly.handler" not in world.ledger.hashes[entry]  # no attempt charged
    world.function("jobs", {"schedules": [nightly()]})
    done = await world.redeliver(entry)
    assert (done.acknowledged, done.outcome) == (True, "completed")


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        ({"occurrence_id": "schedule:jobs:jobs.nightly.handler:2027-01-16T03:00:00Z"},
         "occurrence_id does not match its fields"),
        ({"scheduled_at": "2027-01-15T03:00:07Z",
          "occurrence_id": "schedule:jobs:jobs.nightly.handler:2027-01-15T03:00:07Z"},
         "2027-01-15T03:00:07Z is not a firing of jobs/jobs.nightly.handler"),
        ({"function": None}, "function is missing"),
    ],
)  # fmt: skip
async def test_a_hand_written_occurrence_is_dead_lettered_as_invalid(
    tamper: dict[str, Any], reason: str
) -> None:
    world = world_with(nightly())
    event = msgspec.to_builtins(schedule.envelope("jobs", "jobs.nightly.handler", AT)) | tamper
    event = {k: v for k, v in event.items() if v is not None}
    report = await world.deliver(msgspec.json.encode(event))
    assert (report.acknowledged, report.outcome) == (True, "malformed")
    assert world.runtime.requests == []
    [(_, entry)] = world.dlq.entries
    assert reason in entry.reason
    assert entry.reason.startswith("invalid schedule occurrence: ")
    assert (entry.function, entry.handler) == ("-", "-")


async def test_overlap_skip_acknowledges_while_an_earlier_one_is_running() -> None:
    world = world_with(nightly(cron="* * * * *", overlap="skip", retries=2))
    world.runtime.script[FIELD] = InvocationResult(ok=False, error="slow and failing")
    first = await publish(world, AT)
    second = await publish(world, AT + 60)
    one, two = await world.stream.read(2, 0)
    assert (await world.dispatch(one)).outcome == "retrying"  # not terminal yet
    report = await world.dispatch(two)
    assert (report.acknowledged, report.outcome) == (True, "skipped")
    [skipped] = world.of(ev.OccurrenceSkipped)
    assert skipped.occurrence_id.endswith("2027-01-15T03:01:00Z")
    assert len(world.runtime.requests) == 1
    # once the earlier one is terminal, the next occurrence runs
    world.runtime.script.pop(FIELD)
    world.expire_deadlines(first)
    assert (await world.redeliver(first)).outcome == "completed"
    await publish(world, AT + 120)
    assert (await deliver_next(world)).outcome == "completed"
    assert second not in world.stream.pending


async def test_overlap_allow_runs_alongside() -> None:
    world = world_with(nightly(cron="* * * * *", retries=2))
    world.runtime.script[FIELD] = InvocationResult(ok=False, error="boom")
    await publish(world, AT)
    await publish(world, AT + 60)
    one, two = await world.stream.read(2, 0)
    await world.dispatch(one)
    assert (await world.dispatch(two)).outcome == "retrying"
    assert len(world.runtime.requests) == 2


async def test_overlap_check_that_cannot_be_answered_runs_the_occurrence() -> None:
    world = world_with(nightly(cron="* * * * *", overlap="skip"))
    await publish(world, AT)
    await publish(world, AT + 60)
    world.history.fail_next = 1
    _, two = await world.stream.read(2, 0)
    report = await world.dispatch(two)
    assert report.outcome == "completed"
    [unavailable] = world.of(ev.LedgerUnavailable)
    assert unavailable.call == "overlap"


async def test_a_redelivered_occurrence_runs_once() -> None:
    world = world_with(nightly())
    entry = await publish(world)
    [message] = await world.stream.read(1, 0)
    await world.dispatch(message)
    again = StreamMessage(id=entry, payload=message.payload, deliveries=2, reclaimed=True)
    report = await world.dispatch(again)
    assert report.acknowledged
    assert len(world.runtime.requests) == 1


async def test_a_redelivered_occurrence_is_never_skipped_away() -> None:
    world = world_with(nightly(cron="* * * * *", overlap="skip", retries=2))
    world.runtime.script[FIELD] = InvocationResult(ok=False, error="boom")
    first = await publish(world, AT)
    second = await publish(world, AT + 60)
    one, two = await world.stream.read(2, 0)
    assert (await world.dispatch(one)).outcome == "retrying"
    world.history.fail_next = 1  # the check cannot be answered: the second one runs
    assert (await world.dispatch(two)).outcome == "retrying"
    # both are backing off; the second comes back through recovery first
    world.expire_deadlines(second)
    again = await world.redeliver(second)
    assert (again.acknowledged, again.outcome) == (False, "retrying")  # its retry ran
    assert len(world.runtime.requests) == 3
    assert world.of(ev.OccurrenceSkipped) == []
    assert first in world.stream.pending


async def test_an_occurrence_past_the_publish_if_new_window_is_dead_lettered() -> None:
    """Issue 35.12 (a): a ``relay.schedule`` envelope a producer writes by hand (or
    re-publishes) for a real firing. Past the 7-day window its record is gone, so
    nothing can tell it from a copy: it is dead-lettered whole, never run. Within
    the window a published one still runs (a genuine occurrence may wait that long,
    e.g. for an unavailable function)."""
    world = world_with(nightly())
    week = schedule.DEDUP_TTL_S
    old = AT - week  # 03:00 seven days and five hours before now: past the window
    forged = schedule.encode(schedule.envelope("jobs", "jobs.nightly.handler", old))
    report = await world.deliver(forged)
    assert (report.acknowledged, report.outcome) == (True, "malformed")
    assert world.runtime.requests == []
    [(_, entry)] = world.dlq.entries
    assert "older than the 7-day publish-if-new window" in entry.reason
    assert entry.event == forged.decode()

    # six days and five hours ago, inside the window, published: it runs (a copy
    # would not: see the tests below)
    late = schedule.envelope("jobs", "jobs.nightly.handler", AT - week + 86400)
    assert await world.publisher.publish(late) is not None
    report = await deliver_next(world)
    assert (report.acknowledged, report.outcome) == (True, "completed")
    assert len(world.runtime.requests) == 1


async def test_a_copy_of_a_published_occurrence_is_acknowledged_unrun() -> None:
    """Issue 35.12: a hand-made envelope (same occurrence id, another message) is
    not the entry publish-if-new appended: acknowledged as ``forged`` with a WARN
    line, never run, never dead-lettered; the published one runs."""
    world = world_with(nightly())
    copy = schedule.encode(schedule.envelope("jobs", "jobs.nightly.handler", AT))
    world.stream.add(copy)  # the copy first: order does not matter
    published = await publish(world)
    copied, original = await world.stream.read(2, 0)
    report = await world.dispatch(copied)
    assert (report.acknowledged, report.outcome) == (True, Ended.FORGED)
    assert world.runtime.requests == []
    assert world.dlq.entries == []
    [forged] = world.of(ev.OccurrenceForged)
    assert (forged.message_id, forged.occurrence_id) == (
        copied.id, schedule.occurrence_id("jobs", "jobs.nightly.handler", AT),
    )  # fmt: skip
    assert original.id == published
    report = await world.dispatch(original)
    assert (report.acknowledged, report.outcome) == (True, "completed")
    assert len(world.runtime.requests) == 1


async def test_a_never_published_occurrence_is_a_copy_too() -> None:
    world = world_with(nightly())
    envelope = schedule.encode(schedule.envelope("jobs", "jobs.nightly.handler", AT))
    report = await world.deliver(envelope)
    assert (report.acknowledged, report.outcome) == (True, Ended.FORGED)
    assert world.runtime.requests == []


async def test_a_broker_that_cannot_tell_lets_the_occurrence_run() -> None:
    """Fails open, as ``overlap`` does: at-least-once first."""
    world = world_with(nightly())
    world.history.fail_published = 1
    envelope = schedule.encode(schedule.envelope("jobs", "jobs.nightly.handler", AT))
    report = await world.deliver(envelope)
    assert (report.acknowledged, report.outcome) == (True, "completed")
    [down] = world.of(ev.LedgerUnavailable)
    assert down.call == "provenance"
