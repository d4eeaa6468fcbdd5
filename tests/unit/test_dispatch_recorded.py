"""Defects 1, 2 and 7 of the review, on the whole dispatch path with fakes.

1. An invocation the ledger records gates the acknowledgment until it is terminal,
   even when the rules no longer match it; only a deliberate removal from a valid,
   complete catalog releases it, and an exhausted one is dead-lettered first.
2. An event that cannot be decoded or classified for any reason is dead-lettered
   once, with a reason.
7. A handler never starts on a claim whose remaining lease cannot cover its timeout.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from relay.domain import events as ev
from relay.domain.execution import InvocationResult
from relay.domain.invocation import Running, parse_marker
from relay.domain.outcome import BeginRequest, ClaimRequest, MessageContext
from tests.unit.delivery_world import World, rule

pytestmark = pytest.mark.anyio

FIELD = "fresh/events.fresh.handler"


def fresh_event(world: World) -> bytes:
    """An event the ``now()-5m`` rule below matches now, but not in six minutes."""
    at = datetime.fromtimestamp(world.clock.now(), tz=UTC).isoformat()
    return json.dumps({"table": "users", "at": at}).encode()


def fresh_world(retries: int = 4) -> World:
    world = World()
    world.function(
        "fresh",
        {
            "events": [
                rule(
                    "events.fresh.handler",
                    {"table": ["users"], "at": {"gt": "now()-5m"}},
                    retries=retries,
                )
            ]
        },
    )
    return world


async def test_a_retry_whose_rule_stopped_matching_runs_again_until_it_succeeds() -> None:
    world = fresh_world()
    calls = iter([InvocationResult(ok=False, error="down"), InvocationResult(ok=True)])
    world.runtime.script[FIELD] = lambda _request: next(calls)
    first = await world.deliver(fresh_event(world))
    assert (first.acknowledged, first.outcome) == (False, "retrying")
    world.clock.advance(6 * 60)  # the backoff is over, and the rule no longer matches
    again = await world.redeliver(first.message_id)
    assert (again.acknowledged, again.outcome) == (True, "completed")
    assert [r.handler for r in world.runtime.requests] == ["events.fresh.handler"] * 2
    assert [s.attempt for s in world.of(ev.InvocationSucceeded)] == [2]


async def test_a_retry_whose_rule_stopped_matching_is_dead_lettered_when_exhausted() -> None:
    world = fresh_world(retries=1)
    world.runtime.script[FIELD] = InvocationResult(ok=False, error="down")
    first = await world.deliver(fresh_event(world))
    world.clock.advance(6 * 60)
    again = await world.redeliver(first.message_id)
    assert (again.acknowledged, again.outcome) == (True, "dead_lettered")
    [(_, entry)] = world.dlq.entries
    assert (entry.function, entry.handler_attempts) == ("fresh", 2)


async def test_a_function_with_an_invalid_template_holds_its_recorded_invocations() -> None:
    world = fresh_world()
    world.runtime.script[FIELD] = InvocationResult(ok=False, error="down")
    first = await world.deliver(fresh_event(world))
    # The worker restarts and the template is now invalid: never registered.
    world.registry.drop("fresh")
    world.registry.mark_unavailable("fresh")
    world.clock.advance(6 * 60)
    again = await world.redeliver(first.message_id)
    assert not again.acknowledged
    assert first.message_id in world.stream.pending
    assert world.dlq.entries == []
    assert len(world.runtime.requests) == 1  # nothing ran: its function is not there


async def test_before_the_first_scan_a_missing_function_is_not_taken_for_removed() -> None:
    world = fresh_world()
    world.runtime.script[FIELD] = InvocationResult(ok=False, error="down")
    first = await world.deliver(fresh_event(world))
    world.registry = type(world.registry)()  # a new process: nothing scanned yet
    world.dispatcher._planner._registry = world.registry
    world.clock.advance(6 * 60)
    again = await world.redeliver(first.message_id)
    assert not again.acknowledged


async def test_an_exhausted_invocation_is_dead_lettered_even_after_its_function_went() -> None:
    world = fresh_world(retries=0)
    world.runtime.script[FIELD] = InvocationResult(ok=False, error="down")
    world.dlq.broken = True
    first = await world.deliver(fresh_event(world))
    assert (first.acknowledged, first.outcome) == (False, "dlq_failed")
    world.registry.drop("fresh")  # deliberately removed from a valid catalog
    world.dlq.broken = False
    again = await world.redeliver(first.message_id)
    assert (again.acknowledged, again.outcome) == (True, "dead_lettered")
    [(_, entry)] = world.dlq.entries
    assert entry.function == "fresh"
    assert "down" in entry.reason


async def test_a_deliberately_removed_function_releases_its_backoff() -> None:
    world = fresh_world()
    world.runtime.script[FIELD] = InvocationResult(ok=False, error="down")
    first = await world.deliver(fresh_event(world))
    world.registry.drop("fresh")
    world.clock.advance(6 * 60)
    again = await world.redeliver(first.message_id)
    assert again.acknowledged
    assert world.dlq.entries == []


@pytest.mark.parametrize("depth", [1_000, 100_000])
async def test_an_event_nested_too_deeply_is_dead_lettered_once(depth: int) -> None:
    world = World(max_event_bytes=1024 * 1024)
    world.function("users", {"events": [rule("h.handler", {"table": ["users"]})]})
    payload = b'{"a":' * depth + b"1" + b"}" * depth
    report = await world.deliver(payload)
    assert (report.acknowledged, report.outcome) == (True, "malformed")
    [(_, entry)] = world.dlq.entries
    assert entry.function == "-"
    assert entry.reason.startswith("event could not be decoded or classified")
    assert report.message_id not in world.stream.pending  # never redelivered, never pinned


async def test_a_matcher_that_recurses_too_deeply_dead_letters_the_event() -> None:
    world = World(max_event_bytes=1024 * 1024)
    world.function("users", {"events": [rule("h.handler", {"a": {"b": ["x"]}})]})
    depth = 50_000
    payload = b'{"a":' * depth + b"1" + b"}" * depth
    report = await world.deliver(payload)
    assert report.outcome == "malformed"
    assert world.runtime.requests == []


async def test_a_slow_start_renews_the_lease_before_the_handler_runs() -> None:
    world = World()
    world.function("users", {"events": [rule("h.handler", {"table": ["users"]}, timeout="30s")]})
    seen: list[int] = []

    def check(_request: object) -> InvocationResult:
        message_id = next(iter(world.ledger.hashes))
        marker = parse_marker(world.ledger.hashes[message_id]["users/h.handler"])
        assert isinstance(marker, Running)
        seen.append(marker.deadline_ms - int(world.clock.now() * 1000))
        return InvocationResult(ok=True)

    world.runtime.script["users/h.handler"] = check
    world.runtime.start_delay_s["users"] = 40.0  # a cold start longer than the lease's pad
    report = await world.deliver(b'{"table": "users"}')
    assert report.acknowledged
    assert "renew" in world.ledger.calls
    assert seen[0] >= 30_000  # the handler's whole timeout is covered when it starts
    [renewed] = world.of(ev.LeaseRenewed)
    assert renewed.lease_ms >= 30_000


async def test_a_fast_start_needs_no_renewal() -> None:
    world = World()
    world.function("users", {"events": [rule("h.handler", {"table": ["users"]})]})
    report = await world.deliver(b'{"table": "users"}')
    assert report.acknowledged
    assert "renew" not in world.ledger.calls


async def test_a_claim_taken_over_during_a_slow_start_never_runs_and_charges_nothing() -> None:
    world = World()
    world.function("users", {"events": [rule("h.handler", {"table": ["users"]})]})
    world.runtime.start_delay_s["users"] = 40.0  # past the whole lease
    message_id = world.stream.add(b'{"table": "users"}')
    [message] = await world.stream.read(1, 0)

    async def another_worker_claims() -> None:
        ctx = MessageContext(
            stream="events", group="relay", consumer="w2", message_id=message_id, timestamp="t"
        )
        claim = ClaimRequest(field="users/h.handler", max_attempts=5, lease_ms=60_000)
        begin = BeginRequest(context=ctx, classification="x", token="other", claims=(claim,))
        taken = await world.ledger.begin(begin)
        assert (taken.statuses[0].status, taken.statuses[0].attempt) == ("claimed", 2)

    world.runtime.during_start["users"] = another_worker_claims
    report = await world.dispatch(message)
    assert not report.acknowledged
    assert world.runtime.requests == []  # the handler never started on a lost claim
    # Its release was refused (the claim is the other worker's now): said as fenced.
    assert [f.attempt for f in world.of(ev.InvocationFenced)] == [1]
    marker = parse_marker(world.ledger.hashes[message_id]["users/h.handler"])
    assert isinstance(marker, Running)
    assert (marker.token, marker.attempt) == ("other", 2)  # the new owner's claim stands


async def test_a_ledger_outage_during_renewal_releases_the_claim_uncharged() -> None:
    world = World()
    world.function("users", {"events": [rule("h.handler", {"table": ["users"]})]})
    world.runtime.start_delay_s["users"] = 40.0
    world.ledger.fail_next.add("renew")
    report = await world.deliver(b'{"table": "users"}')
    assert not report.acknowledged
    assert world.runtime.requests == []
    h = world.ledger.hashes[report.message_id]
    assert "users/h.handler" not in h  # released: attempt 1 was never charged
    [deferred] = world.of(ev.InvocationDeferred)
    assert deferred.reason == "lease_unrenewable"


async def test_a_template_that_cannot_be_read_holds_new_events_it_might_match() -> None:
    """It might match them; nothing is acknowledged until it is fixed, while every
    other function still runs."""
    world = World()
    world.function("users", {"events": [rule("h.handler", {"table": ["users"]})]})
    world.registry.mark_unavailable("broken")  # its template.yaml does not parse
    unmatched = await world.deliver(b'{"table": "orders"}')
    matched = await world.deliver(b'{"table": "users"}')
    assert (unmatched.acknowledged, unmatched.outcome) == (False, "function_unavailable")
    assert (matched.acknowledged, matched.outcome) == (False, "function_unavailable")
    assert world.handlers_run() == ["users/h.handler"]  # the others are not held back
    world.function("broken", {"events": [rule("b.handler", {"table": ["orders"]})]})  # fixed
    assert (await world.redeliver(unmatched.message_id)).outcome == "completed"
    assert (await world.redeliver(matched.message_id)).outcome == "completed"
    assert world.handlers_run() == ["users/h.handler", "broken/b.handler"]  # nothing re-ran
