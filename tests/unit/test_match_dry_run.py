"""The dry run (``relay function match --from-stream``) against the real dispatcher on fakes:
the same entries, the same counts; ``now()`` at each entry's own time; the explanation."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest

from relay.application.dry_run import DryRun, DryRunReport, SampledEntry, dry_run_catalog
from relay.domain import events as ev
from relay.domain import schedule
from relay.domain.outcome import rfc3339
from relay.domain.retention import StreamId
from relay.domain.template import parse_template
from tests.unit.delivery_world import World, rule

pytestmark = pytest.mark.anyio

FUNCTIONS: dict[str, dict[str, Any]] = {
    "users": {
        "events": [
            rule("events.created.handler", {"event_name": ["INSERT"], "table_name": ["users"]}),
            rule("events.updated.handler", {"event_name": ["MODIFY"], "table_name": ["users"]}),
            # time-based: only rows created within five minutes of the event's arrival
            rule(
                "events.recent.handler",
                {"table_name": ["users"], "new_image": {"created_at": {"gt": "now()-5m"}}},
            ),
        ]
    },
    "orders": {
        "events": [
            rule("orders.big.handler", {"table_name": ["orders"], "total": {"gte": 100}}),
            rule("orders.kind.handler", {"detail": {"kind": {"prefix": ["order."]}}}),
        ],
        "schedules": [{"handler": "orders.nightly.handler", "cron": "0 3 * * *"}],
    },
}


def random_payload(rng: random.Random, now: float) -> bytes | None:
    """Hits, misses, near misses and every kind of malformed entry."""
    kind = rng.randrange(12)
    if kind == 0:
        return b"{not json"
    if kind == 1:
        return None  # no event field
    if kind == 2:
        return json.dumps({"pad": "x" * 2000}).encode()  # over the world's 1024 bytes
    if kind == 3:
        return b"[1, 2]"
    if kind == 4:  # claims to be an occurrence, but Relay did not write it
        return json.dumps({"source": "relay.schedule", "function": "orders"}).encode()
    if kind == 5:  # a real occurrence of a real schedule: matching is bypassed
        return schedule.encode(schedule.envelope("orders", "orders.nightly.handler", 1_799_982_000))
    event: dict[str, Any] = {
        "event_name": rng.choice(["INSERT", "MODIFY", "REMOVE"]),
        "table_name": rng.choice(["users", "orders", "other"]),
    }
    if rng.random() < 0.6:
        age_s = rng.choice([60, 240, 400, 3600])
        event["new_image"] = {"created_at": rfc3339(now - age_s)}
    if rng.random() < 0.5:
        event["total"] = rng.choice([5, 100, 250, "100"])
    if rng.random() < 0.4:
        event["detail"] = {"kind": rng.choice(["order.placed", "refund", 7])}
    return json.dumps(event).encode()


def world_with_functions() -> World:
    world = World()
    for name, template in FUNCTIONS.items():
        world.function(name, template)
    return world


def sampled(world: World) -> list[SampledEntry]:
    """The stream's entries, newest first, as a reader hands them to the dry run."""
    return [
        SampledEntry(id=i, payload=p, at=StreamId.parse(i).ms / 1000)
        for i, p in reversed(world.stream.entries.items())
    ]


def dry_run(world: World, entries: list[SampledEntry], **options: Any) -> DryRunReport:
    counter = DryRun(world.registry.current(), max_event_bytes=1024, **options)
    for entry in entries:
        counter.add(entry)
    return counter.report()


async def test_the_dry_run_counts_exactly_what_the_dispatcher_did_with_the_same_entries() -> None:
    world = world_with_functions()
    rng = random.Random(24)
    for _ in range(400):
        world.clock.advance(7)  # whole seconds: an entry's id holds its time exactly
        await world.deliver(random_payload(rng, world.clock.now()))
    world.clock.advance(6 * 3600)  # the dry run happens hours later

    report = dry_run(world, sampled(world))

    classified = world.of(ev.EventClassified)
    ran = Counter((r.function, r.handler) for r in world.runtime.requests)
    # every occurrence here is written by hand: the worker runs none (copies, not the
    # entry publish-if-new appended); the dry run reads no dedup record and counts them
    occurrences = len(world.of(ev.OccurrenceForged))
    assert not any(r.handler == "orders.nightly.handler" for r in world.runtime.requests)
    assert report.entries == 400
    assert report.malformed == len(world.of(ev.EventMalformed)) > 0
    assert report.matched == sum(1 for c in classified if c.matched) > 0
    assert report.unmatched == sum(1 for c in classified if not c.matched) > 0
    assert report.occurrences == occurrences > 0
    assert {(r.function, r.handler): r.matched for r in report.rules} == {
        (name, event_rule["handler"]): ran[name, event_rule["handler"]]
        for name, template in FUNCTIONS.items()
        for event_rule in template["events"]
    }
    assert report.entries == report.matched + report.unmatched + report.malformed + occurrences
    # the time-based rule matched at each entry's time (six hours later it would match none)
    assert ran["users", "events.recent.handler"] > 0


def test_now_is_each_entry_own_time_unless_at_is_given() -> None:
    world = world_with_functions()
    appended = 1_800_000_000.0
    event = {"table_name": "users", "new_image": {"created_at": rfc3339(appended - 60)}}
    entry = SampledEntry(id=f"{int(appended * 1000)}-0", payload=json.dumps(event).encode(),
                         at=appended)  # fmt: skip

    def recent(report: DryRunReport) -> int:
        return next(r.matched for r in report.rules if r.handler == "events.recent.handler")

    # a minute old when it arrived: a worker keeping up matched it, however late we look
    assert recent(dry_run(world, [entry])) == 1
    # evaluated an hour after its arrival, the five-minute window has passed
    assert recent(dry_run(world, [entry], at=appended + 3600)) == 0


def test_explain_keeps_the_nearest_misses_with_every_failing_condition() -> None:
    world = world_with_functions()
    events = [
        {"event_name": "REMOVE", "table_name": "other"},  # two conditions fail
        {"event_name": "REMOVE", "table_name": "users"},  # one fails: the nearest miss
        {"event_name": "INSERT", "table_name": "users"},  # matches
    ]
    entries = [
        SampledEntry(id=f"{n}-0", payload=json.dumps(e).encode(), at=1_800_000_000.0)
        for n, e in enumerate(events, start=1)
    ]
    report = dry_run(world, entries, explain=True)
    created = next(r for r in report.rules if r.handler == "events.created.handler")
    assert created.matched == 1
    assert [(n.id, n.reasons) for n in created.non_matches] == [
        ("2-0", ('pattern.event_name: "REMOVE" is not one of ["INSERT"]',)),
        (
            "1-0",
            (
                'pattern.event_name: "REMOVE" is not one of ["INSERT"]',
                'pattern.table_name: "other" is not one of ["users"]',
            ),
        ),
    ]
    # without --explain nothing is worded (the cost stays that of matching)
    plain = dry_run(world, entries)
    assert all(r.non_matches == () for r in plain.rules)


def test_a_dead_letter_placeholder_counts_as_malformed_with_its_recorded_reason() -> None:
    world = world_with_functions()
    summary = SampledEntry(
        id="5-0",
        payload=b'{"table_name": "users", ... (300000 bytes, truncated)',
        at=1.0,
        recorded="event is 300000 bytes, larger than MAX_EVENT_BYTES (262144)",
    )
    report = dry_run(world, [summary])
    assert (report.malformed, report.matched, report.unmatched) == (1, 0, 0)
    assert report.malformed_samples[0].reason.startswith("event is 300000 bytes")


def test_a_template_that_cannot_load_waits_its_occurrences_and_the_others_still_count() -> None:
    valid = parse_template({"runtime": "python3.14", **FUNCTIONS["users"]})
    catalog = dry_run_catalog({"users": valid}, ["orders"])
    counter = DryRun(catalog, max_event_bytes=1024)
    insert = json.dumps({"event_name": "INSERT", "table_name": "users"}).encode()
    occurrence = schedule.encode(
        schedule.envelope("orders", "orders.nightly.handler", 1_799_982_000)
    )
    for n, payload in enumerate([insert, occurrence]):
        counter.add(SampledEntry(id=f"{n}-0", payload=payload, at=1_800_000_000.0))
    report = counter.report()
    assert (report.matched, report.occurrences, report.malformed) == (1, 1, 0)
    assert [r.function for r in report.rules] == ["users"] * 3
