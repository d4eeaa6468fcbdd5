"""The handler's context (``RELAY_MESSAGE_ID``, ``RELAY_ATTEMPT``, ``RELAY_DEADLINE``,
``RELAY_OCCURRENCE_ID``): where each request is built (delivery, an occurrence,
``relay function invoke``, ``relay dlq replay``) and how the runtime puts it in the
request frame."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import msgspec
import pytest

from relay.application.bus import MessageBus
from relay.application.concurrency import Slots
from relay.application.invoke import FunctionInvoker
from relay.application.registry import ActiveFunction, FunctionRegistry
from relay.domain import schedule
from relay.domain.commands import InvokeFunction, ReplayDeadLetter
from relay.domain.errors import TemplateError
from relay.domain.execution import InvocationRequest, InvocationResult
from relay.domain.handler_context import HandlerContext, deadline_text, invocation_env
from relay.domain.template import parse_template
from tests.fakes import FakeClock, InMemoryContainerRuntime, InMemorySecretStore, SequentialTokens
from tests.unit.attach_frames import answer
from tests.unit.delivery_world import World, rule
from tests.unit.test_replay import entry as dead_letter
from tests.unit.test_replay import setup as replay_setup
from tests.unit.test_runtime_protocol import make

pytestmark = pytest.mark.anyio

INSERT = b'{"table": "users"}'


def parse_deadline(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


# --- the variables themselves ---------------------------------------------------------
def test_the_deadline_is_rfc3339_utc_in_milliseconds_never_later_than_the_instant() -> None:
    at = datetime(2026, 3, 29, 1, 0, 0, 250_999, tzinfo=UTC).timestamp()
    assert deadline_text(at) == "2026-03-29T01:00:00.250Z"
    assert deadline_text(datetime(2026, 1, 1, tzinfo=UTC).timestamp()) == (
        "2026-01-01T00:00:00.000Z"
    )


def test_an_event_gets_no_occurrence_id_and_a_request_without_context_only_the_basics() -> None:
    ctx = HandlerContext(message_id="1-0", attempt=3)
    assert invocation_env("m.h", ctx, 0.0) == {
        "RELAY_HANDLER": "m.h",
        "RELAY_MESSAGE_ID": "1-0",
        "RELAY_ATTEMPT": "3",
        "RELAY_DEADLINE": "1970-01-01T00:00:00.000Z",
    }
    assert invocation_env("m.h", None, 0.0) == {
        "RELAY_HANDLER": "m.h",
        "RELAY_DEADLINE": "1970-01-01T00:00:00.000Z",
    }


@pytest.mark.parametrize(
    "name", ["RELAY_MESSAGE_ID", "RELAY_ATTEMPT", "RELAY_DEADLINE", "RELAY_OCCURRENCE_ID"]
)
@pytest.mark.parametrize("section", ["env", "secrets"])
def test_a_template_cannot_set_a_context_variable(section: str, name: str) -> None:
    value = "x" if section == "env" else "some-secret"
    doc = {"runtime": "python3.14", section: {name: value}}
    with pytest.raises(TemplateError) as caught:
        parse_template(doc)
    assert caught.value.problems == [f"{section}.{name}: is reserved by Relay"]


# --- the runtime's request frame ------------------------------------------------------
async def test_the_request_frame_carries_the_context_and_a_deadline_timeout_from_now() -> None:
    container, stream = make(lambda n: [answer(n)])
    request = InvocationRequest(
        function="fn",
        handler="mod.h",
        event=b"{}",
        env={"K": "v"},
        handler_context=HandlerContext(
            message_id="17-3", attempt=2, occurrence_id="schedule:fn:mod.h:2026-06-01T03:00:00Z"
        ),
    )
    before = time.time()
    answered = await container.call(request, 6.0, lambda _: None)
    assert (answered.ok, answered.error) == (True, "")
    after = time.time()
    (sent,) = stream.requests
    env = sent["env"]
    deadline = parse_deadline(env.pop("RELAY_DEADLINE"))
    assert env == {
        "K": "v",
        "RELAY_HANDLER": "mod.h",
        "RELAY_MESSAGE_ID": "17-3",
        "RELAY_ATTEMPT": "2",
        "RELAY_OCCURRENCE_ID": "schedule:fn:mod.h:2026-06-01T03:00:00Z",
    }
    # rounded down to the millisecond, from a moment within the call
    assert before + 6.0 - 0.001 <= deadline <= after + 6.0
    assert sent["event"] == "{}"  # the payload stays exactly the event


# --- delivery -------------------------------------------------------------------------
async def test_delivery_passes_the_message_id_and_the_attempt_counted_across_a_retry() -> None:
    world = World()
    world.function("users", {"events": [rule("events.flaky.handler", {"table": ["users"]})]})
    world.runtime.script["users/events.flaky.handler"] = InvocationResult(ok=False, error="boom")
    first = await world.deliver(INSERT)
    assert (first.acknowledged, first.outcome) == (False, "retrying")
    del world.runtime.script["users/events.flaky.handler"]
    world.expire_deadlines(first.message_id)
    assert (await world.redeliver(first.message_id)).acknowledged
    assert [r.handler_context for r in world.runtime.requests] == [
        HandlerContext(message_id=first.message_id, attempt=1),
        HandlerContext(message_id=first.message_id, attempt=2),
    ]


async def test_an_occurrence_passes_its_occurrence_id() -> None:
    world = World()
    nightly = {"handler": "jobs.nightly.handler", "cron": "0 3 * * *"}
    world.function("jobs", {"schedules": [nightly]})
    at = int(datetime(2027, 1, 15, 3, 0, tzinfo=UTC).timestamp())  # within a week of the clock
    entry = await world.publisher.publish(schedule.envelope("jobs", "jobs.nightly.handler", at))
    assert entry is not None
    [message] = await world.stream.read(1, 0)
    assert (await world.dispatch(message)).acknowledged
    [request] = world.runtime.requests
    assert request.handler_context == HandlerContext(
        message_id=entry,
        attempt=1,
        occurrence_id="schedule:jobs:jobs.nightly.handler:2027-01-15T03:00:00Z",
    )


# --- relay function invoke and relay dlq replay --------------------------------------
async def test_an_invoke_gets_one_made_up_message_id_per_command_and_attempt_one() -> None:
    template = parse_template(
        {
            "runtime": "python3.14",
            "events": [
                rule("events.a.handler", {"table": ["users"]}),
                rule("events.b.handler", {"table": ["users"]}),
            ],
        }
    )
    registry = FunctionRegistry()
    registry.put(
        ActiveFunction(
            name="users",
            directory="/functions/users",
            template=template,
            runtime="python3.14",
            image="img",
            fingerprint=None,
            prepared_at=None,
        )
    )
    runtime = InMemoryContainerRuntime()
    runtime.activate("users", "img", "python3.14", 2)
    invoker = FunctionInvoker(
        registry=registry,
        runtime=runtime,
        slots=Slots(4),
        secrets=InMemorySecretStore(),
        clock=FakeClock(),
        tokens=SequentialTokens(),
        emit=lambda _e: None,
    )
    bus = MessageBus({InvokeFunction: invoker})
    await bus.send(InvokeFunction(function="users", event={"table": "users"}))
    await bus.send(InvokeFunction(function="users", event={"table": "users"}))
    contexts = [r.handler_context for r in runtime.requests]
    assert contexts == [
        HandlerContext(message_id="invoke-t1", attempt=1),
        HandlerContext(message_id="invoke-t1", attempt=1),
        HandlerContext(message_id="invoke-t2", attempt=1),
        HandlerContext(message_id="invoke-t2", attempt=1),
    ]


async def test_a_replay_is_the_original_message_one_attempt_past_the_recorded_ones() -> None:
    bus, runtime, _ = replay_setup({"5-0": dead_letter()})  # 5 attempts recorded
    await bus.send(ReplayDeadLetter(entry_id="5-0"))
    [request] = runtime.requests
    assert request.handler_context == HandlerContext(message_id="1-0", attempt=6)


async def test_a_replayed_occurrence_keeps_its_occurrence_id() -> None:
    at = int(datetime(2026, 6, 1, 3, 0, tzinfo=UTC).timestamp())
    envelope = schedule.envelope("users", "jobs.nightly.handler", at)
    recorded = msgspec.structs.replace(
        dead_letter(handler="jobs.nightly.handler"),
        event=schedule.encode(envelope).decode(),
        handler_attempts=0,  # an entry that records no attempt: the replay is the first
    )
    bus, runtime, _ = replay_setup({"7-0": recorded})
    await bus.send(ReplayDeadLetter(entry_id="7-0"))
    [request] = runtime.requests
    assert request.handler_context == HandlerContext(
        message_id="1-0", attempt=1, occurrence_id=envelope.occurrence_id
    )
