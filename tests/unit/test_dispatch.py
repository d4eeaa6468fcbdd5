"""DispatchMessage on in-memory fakes: outcomes, retries, DLQ, classification, fencing."""

from __future__ import annotations

import anyio
import pytest
from structlog.testing import capture_logs

from relay.application.registry import FunctionRegistry
from relay.domain import events as ev
from relay.domain.execution import InvocationRequest, InvocationResult
from relay.domain.invocation import Running as RunningMarker
from relay.domain.invocation import format_marker, parse_marker
from tests.unit.delivery_world import World, rule

pytestmark = pytest.mark.anyio

USERS = {"events": [rule("events.created.handler", {"table": ["users"]})]}
INSERT = b'{"table": "users", "id": 1}'


def counters(world: World) -> tuple[int, int, int]:
    classified = world.of(ev.EventClassified)
    matched = sum(1 for c in classified if c.matched)
    return len(classified), matched, len(classified) - matched


async def test_unmatched_events_are_acknowledged_and_counted_once() -> None:
    world = World()
    world.function("users", USERS)
    report = await world.deliver(b'{"table": "orders"}')
    assert (report.acknowledged, report.outcome) == (True, "unmatched")
    assert world.runtime.requests == []
    assert counters(world) == (1, 0, 1)
    assert world.of(ev.MessageAcknowledged)[0].outcome == "unmatched"


async def test_every_matching_rule_runs_in_order_then_the_message_is_acked() -> None:
    world = World()
    world.function("b-mail", {"events": [rule("mail.send", {"table": ["users"]})]})
    world.function(
        "a-users",
        {
            "events": [
                rule("events.created.handler", {"table": ["users"]}),
                rule("events.audit.handler", {"id": [1]}),
            ]
        },
    )
    report = await world.deliver(INSERT)
    assert (report.acknowledged, report.outcome) == (True, "completed")
    assert world.handlers_run() == [
        "a-users/events.created.handler",
        "a-users/events.audit.handler",
        "b-mail/mail.send",
    ]
    assert world.runtime.requests[0].event == INSERT
    [classified] = world.of(ev.EventClassified)
    assert classified.functions == ("a-users", "b-mail")
    assert [s.attempt for s in world.of(ev.InvocationSucceeded)] == [1, 1, 1]


async def test_a_failure_does_not_stop_the_others_and_only_it_is_retried() -> None:
    world = World()
    world.function(
        "users",
        {
            "events": [
                rule("events.flaky.handler", {"table": ["users"]}),
                rule("events.fine.handler", {"table": ["users"]}),
            ]
        },
    )
    world.runtime.script["users/events.flaky.handler"] = InvocationResult(ok=False, error="boom")
    first = await world.deliver(INSERT)
    assert (first.acknowledged, first.outcome) == (False, "retrying")
    assert world.handlers_run() == ["users/events.flaky.handler", "users/events.fine.handler"]
    [failed] = world.of(ev.InvocationFailed)
    assert (failed.attempt, failed.retry_in_s, failed.error) == (1, 60.0, "boom")
    message_id = first.message_id
    # Redelivered inside the backoff: nothing runs.
    early = await world.redeliver(message_id)
    assert (early.acknowledged, early.outcome) == (False, "retrying")
    assert len(world.runtime.requests) == 2
    # After the backoff only the failed invocation runs again.
    del world.runtime.script["users/events.flaky.handler"]
    world.expire_deadlines(message_id)
    last = await world.redeliver(message_id)
    assert last.acknowledged
    assert world.handlers_run()[2:] == ["users/events.flaky.handler"]
    assert world.of(ev.InvocationSucceeded)[-1].attempt == 2
    assert counters(world) == (1, 1, 0)  # classified once across three deliveries


async def test_an_always_failing_handler_runs_one_plus_retries_times_then_dead_letters() -> None:
    world = World()
    world.function(
        "users", {"events": [rule("events.bad.handler", {"table": ["users"]}, retries=2)]}
    )
    world.runtime.script["users/events.bad.handler"] = InvocationResult(
        ok=False, error="exit 1", exit_code=1
    )
    report = await world.deliver(INSERT)
    for _ in range(10):
        if report.acknowledged:
            break
        world.expire_deadlines(report.message_id)
        report = await world.redeliver(report.message_id)
    assert (report.acknowledged, report.outcome) == (True, "dead_lettered")
    assert len(world.runtime.requests) == 3
    [exhausted] = world.of(ev.InvocationExhausted)
    assert exhausted.attempt == 3
    [(_, entry)] = world.dlq.entries
    assert (entry.function, entry.handler, entry.handler_attempts) == (
        "users",
        "events.bad.handler",
        3,
    )
    assert entry.deliveries == 3
    assert entry.event == INSERT.decode()
    assert "retries exhausted after 3 attempt(s)" in entry.reason
    assert "exit 1" in entry.reason
    [dead] = world.of(ev.MessageDeadLettered)
    assert (dead.function, dead.handler_attempts, dead.entry_id) == ("users", 3, "1-0")


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (None, "missing event field"),
        (b"[1, 2, 3]", "not an object"),
        (b"{oops", "not valid JSON"),
        (b"\xff", "not a UTF-8 string"),
        (b'{"table": "users", "pad": "' + b"x" * 2000 + b'"}', "larger than MAX_EVENT_BYTES"),
    ],
)
async def test_malformed_messages_are_dead_lettered_at_once(
    payload: bytes | None, reason: str
) -> None:
    world = World(max_event_bytes=1024)
    world.function("users", USERS)
    report = await world.deliver(payload)
    assert (report.acknowledged, report.outcome) == (True, "malformed")
    assert world.runtime.requests == []
    assert counters(world) == (0, 0, 0)
    [(_, entry)] = world.dlq.entries
    assert (entry.function, entry.handler, entry.handler_attempts) == ("-", "-", 0)
    assert reason in entry.reason
    [dead] = world.of(ev.MessageDeadLettered)
    assert (dead.function, dead.handler) == ("-", "-")


async def test_a_function_still_building_keeps_the_message_pending_without_an_attempt() -> None:
    world = World()
    world.function("users", USERS, image=None)
    report = await world.deliver(INSERT)
    assert (report.acknowledged, report.outcome) == (False, "building")
    assert world.runtime.requests == []
    assert "users/events.created.handler" not in world.ledger.hashes[report.message_id]
    assert counters(world) == (1, 1, 0)  # matched, not unmatched
    world.function("users", USERS, image="img")
    again = await world.redeliver(report.message_id)
    assert again.acknowledged
    assert world.of(ev.InvocationStarted)[0].attempt == 1
    assert counters(world) == (1, 1, 0)


async def test_no_slot_leaves_the_message_pending_without_charging_an_attempt() -> None:
    world = World(slot_wait_s=0.01)
    world.function("users", {"concurrency": 1, **USERS})
    held = anyio.Event()
    release = anyio.Event()

    async def hold() -> None:
        async with world.slots.acquire("users"):
            held.set()
            await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold)
        await held.wait()
        with capture_logs() as logs:
            report = await world.deliver(INSERT)
        release.set()
    assert (report.acknowledged, report.outcome) == (False, "deferred")
    [line] = [e for e in logs if e["event"] == "invocation_deferred"]
    assert (line["log_level"], line["function"], line["reason"]) == (
        "warning",
        "users",
        "slot_unavailable",
    )
    assert world.runtime.requests == []
    assert "users/events.created.handler" not in world.ledger.hashes[report.message_id]
    [deferred] = world.of(ev.InvocationDeferred)
    assert deferred.reason == "slot_unavailable"
    again = await world.redeliver(report.message_id)
    assert again.acknowledged
    assert world.of(ev.InvocationStarted)[0].attempt == 1


async def test_a_claim_error_fails_closed() -> None:
    world = World()
    world.function("users", USERS)
    world.ledger.fail_next.add("begin")
    report = await world.deliver(INSERT)
    assert (report.acknowledged, report.outcome) == (False, "claim_failed")
    assert world.runtime.requests == []
    assert counters(world) == (0, 0, 0)  # a missed count beats a double count
    assert report.message_id in world.stream.pending
    assert (await world.redeliver(report.message_id)).acknowledged


async def test_a_lost_finish_reruns_after_the_claim_expires() -> None:
    world = World()
    world.function("users", USERS)
    world.ledger.fail_next.add("finish")
    report = await world.deliver(INSERT)
    assert (report.acknowledged, report.outcome) == (False, "finish_failed")
    blocked = await world.redeliver(report.message_id)  # the claim still protects it
    assert (blocked.acknowledged, blocked.outcome) == (False, "in_progress")
    assert len(world.runtime.requests) == 1
    world.expire_deadlines(report.message_id)
    assert (await world.redeliver(report.message_id)).acknowledged
    assert [s.attempt for s in world.of(ev.InvocationStarted)] == [1, 2]


async def test_a_late_result_after_a_takeover_is_fenced() -> None:
    world = World()
    world.function("users", USERS)
    field = "users/events.created.handler"

    def taken_over(request: InvocationRequest) -> InvocationResult:
        # While this worker runs, its claim expires and another worker claims it.
        h = world.ledger.hashes[request.context]
        marker = parse_marker(h[field])
        assert isinstance(marker, RunningMarker)
        h[field] = format_marker(RunningMarker(marker.deadline_ms, marker.attempt + 1, "other"))
        return InvocationResult(ok=True)

    world.runtime.script[field] = taken_over
    report = await world.deliver(INSERT)
    assert not report.acknowledged
    [fenced] = world.of(ev.InvocationFenced)
    assert (fenced.function, fenced.handler, fenced.attempt) == (
        "users",
        "events.created.handler",
        1,
    )
    assert world.of(ev.InvocationSucceeded) == []
    assert world.ledger.hashes[report.message_id][field].endswith("#2#other")


async def test_a_missing_secret_is_a_charged_failure() -> None:
    world = World()
    world.function("users", {"secrets": {"TOKEN": "api-token"}, **USERS})
    report = await world.deliver(INSERT)
    assert not report.acknowledged
    [failed] = world.of(ev.InvocationFailed)
    assert "api-token" in failed.error
    assert world.runtime.requests == []
    world.secrets.values["api-token"] = "s3cret"
    world.expire_deadlines(report.message_id)
    assert (await world.redeliver(report.message_id)).acknowledged
    assert world.runtime.requests[0].env == {"TOKEN": "s3cret"}


async def test_an_unwritable_dlq_keeps_the_message_then_routes_it_without_rerunning() -> None:
    world = World()
    world.function(
        "users", {"events": [rule("events.bad.handler", {"table": ["users"]}, retries=0)]}
    )
    world.runtime.script["users/events.bad.handler"] = InvocationResult(ok=False, error="boom")
    world.dlq.broken = True
    report = await world.deliver(INSERT)
    assert (report.acknowledged, report.outcome) == (False, "dlq_failed")
    assert len(world.of(ev.DeadLetterWriteFailed)) == 1
    world.dlq.broken = False
    again = await world.redeliver(report.message_id)
    assert (again.acknowledged, again.outcome) == (True, "dead_lettered")
    assert len(world.runtime.requests) == 1
    assert len(world.dlq.entries) == 1
    assert len(world.of(ev.InvocationExhausted)) == 1


async def test_a_removed_function_no_longer_gates_the_ack() -> None:
    world = World()
    world.function("users", USERS)
    world.runtime.script["users/events.created.handler"] = InvocationResult(ok=False, error="x")
    report = await world.deliver(INSERT)
    assert not report.acknowledged
    world.registry.drop("users")
    world.expire_deadlines(report.message_id)
    again = await world.redeliver(report.message_id)
    assert again.acknowledged
    assert counters(world) == (1, 1, 0)  # still counted as it was first classified


async def test_a_crashed_worker_still_moves_the_invocation_toward_the_dlq() -> None:
    world = World()
    world.function(
        "users", {"events": [rule("events.created.handler", {"table": ["users"]}, retries=1)]}
    )
    message_id = world.stream.add(INSERT)
    await world.stream.read(1, 0)
    # Two workers died mid-run: their claims expired without a result.
    world.ledger.hashes[message_id] = {"users/events.created.handler": "running:1000#2#dead"}
    report = await world.redeliver(message_id)
    assert (report.acknowledged, report.outcome) == (True, "dead_lettered")
    assert world.runtime.requests == []
    [exhausted] = world.of(ev.InvocationExhausted)
    assert exhausted.attempt == 2
    assert world.dlq.entries[0][1].handler_attempts == 2


async def test_shutdown_mid_message_releases_the_claims_it_did_not_finish() -> None:
    world = World()
    world.function(
        "users",
        {
            "events": [
                rule("events.slow.handler", {"table": ["users"]}),
                rule("events.next.handler", {"table": ["users"]}),
            ]
        },
    )
    started = anyio.Event()

    async def slow(request: InvocationRequest) -> InvocationResult:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    world.runtime.script["users/events.slow.handler"] = slow
    message_id = world.stream.add(INSERT)
    [message] = await world.stream.read(1, 0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(world.dispatch, message)
        await started.wait()
        tg.cancel_scope.cancel()
    # Neither claim charged an attempt: both markers are back to absent.
    assert world.ledger.hashes[message_id] == {"@class": "matched:users#t1"}
    assert world.ledger.calls == ["begin", "finish"]
    assert message_id in world.stream.pending


async def test_an_event_held_before_any_catalog_loaded_is_not_counted_unmatched() -> None:
    """Issue 35.2: a worker with nothing to serve yet (git source not synced, the
    directory gone) holds the event pending without classifying it; once the
    functions load, it is classified (matched) and counted exactly once."""
    world = World(registry=FunctionRegistry())  # nothing scanned yet: incomplete
    report = await world.deliver(INSERT)
    assert not report.acknowledged
    assert counters(world) == (0, 0, 0)
    [message_id] = world.stream.pending
    assert "@class" not in world.ledger.hashes.get(message_id, {})
    world.function("users", USERS)
    world.registry.mark_complete()
    report = await world.redeliver(message_id)
    assert report.acknowledged
    assert counters(world) == (1, 1, 0)


async def test_an_event_that_might_match_an_unreadable_template_waits_unclassified() -> None:
    world = World()
    world.function("users", USERS)
    world.registry.mark_unavailable("broken")
    report = await world.deliver(b'{"table": "orders"}')
    assert not report.acknowledged
    assert counters(world) == (0, 0, 0)
