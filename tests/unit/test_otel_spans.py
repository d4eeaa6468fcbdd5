"""Delivery spans on in-memory fakes with the real SDK and an in-memory exporter:
the dispatcher runs through the traced ports (stream, ledger, invoker) and the
spans are built from what they and the domain events observe."""

from __future__ import annotations

import msgspec
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracer, StatusCode

from relay.adapters.otel.spans import DeliveryTraces
from relay.adapters.otel.wrappers import TracedInvoker, TracedLedger, TracedStream
from relay.application.bus import MessageBus
from relay.application.dispatch import MessageDispatcher
from relay.domain import events as ev
from relay.domain.commands import DispatchMessage
from relay.domain.execution import InvocationRequest, InvocationResult
from relay.domain.handler_context import HandlerContext
from relay.domain.outcome import StreamMessage
from tests.fakes import SequentialTokens
from tests.unit.delivery_world import World, rule

pytestmark = pytest.mark.anyio

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
GOOD = f"00-{TRACE}-{PARENT}-01"
USERS = {"events": [rule("events.created.handler", {"table": ["users"]}, retries=1)]}
INSERT = b'{"table": "users"}'


class Traced:
    """A :class:`World` whose dispatcher runs through the traced ports."""

    def __init__(self, *, max_open: int = 100) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.traces = DeliveryTraces(provider.get_tracer("test"), max_open=max_open)
        w = self.world = World()
        self.bus = MessageBus({})
        self.stream = TracedStream(w.stream, self.traces)
        dispatcher = MessageDispatcher(
            stream=w.stream,
            ledger=TracedLedger(w.ledger, self.traces),
            registry=w.registry,
            runtime=TracedInvoker(w.runtime, self.traces),
            slots=w.slots,
            secrets=w.secrets,
            clock=w.clock,
            tokens=SequentialTokens(),
            max_event_bytes=1024,
            slot_wait_s=0.05,
            notify=self.bus.emit,
        )
        self.bus.register(DispatchMessage, dispatcher)
        self.traces.subscribe(self.bus)

    async def deliver(self, payload: bytes, traceparent: str = "") -> StreamMessage:
        self.world.stream.add(payload)
        [message] = await self.world.stream.read(1, 0)
        # what a broker reads from the entry's traceparent field
        message = msgspec.structs.replace(message, traceparent=traceparent)
        self.traces.read(message, self.stream.stream)
        await self.bus.send(DispatchMessage(message=message))
        return message

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]


def one(spans: list[ReadableSpan]) -> ReadableSpan:
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


def attr(span: ReadableSpan, name: str) -> object:
    return (span.attributes or {}).get(name)


def parent_of(span: ReadableSpan) -> int:
    assert span.parent is not None
    return span.parent.span_id


async def test_a_message_with_a_traceparent_joins_the_producers_trace() -> None:
    t = Traced()
    t.world.function("users", USERS)
    handlers: list[InvocationRequest] = []

    def acquire_then_run(request: InvocationRequest) -> InvocationResult:
        # the Docker pool notifies its acquire from inside invoke, in the same task
        t.bus.emit(ev.ContainerAcquired(function="users", outcome="cold", wait_s=0.25))
        handlers.append(request)
        return InvocationResult(ok=True, duration_s=0.01)

    t.world.runtime.script["users/events.created.handler"] = acquire_then_run
    message = await t.deliver(INSERT, GOOD)
    msg = one(t.spans("relay.message"))
    inv = one(t.spans("relay.invocation"))
    claim, settle = one(t.spans("relay.claim")), one(t.spans("relay.settle"))
    assert f"{msg.context.trace_id:032x}" == TRACE
    assert {f"{s.context.trace_id:032x}" for s in t.exporter.get_finished_spans()} == {TRACE}
    assert f"{parent_of(msg):016x}" == PARENT
    for child in (inv, claim, settle):
        assert parent_of(child) == msg.context.span_id
    acquire, handler = one(t.spans("relay.container.acquire")), one(t.spans("relay.handler"))
    assert parent_of(acquire) == parent_of(handler) == inv.context.span_id
    assert attr(acquire, "relay.container.outcome") == "cold"
    assert inv.attributes == {
        "relay.function": "users",
        "relay.handler": "events.created.handler",
        "relay.message_id": message.id,
        "relay.attempt": 1,
        "relay.invocation_id": f"{message.id}/users/events.created.handler/1",
        "relay.outcome": "success",
        "relay.duration_s": 0.01,
    }
    assert attr(msg, "relay.outcome") == "completed"
    assert [e.name for e in msg.events] == ["classified"]
    # the handler's TRACEPARENT is its invocation span's context, not the producer's
    [request] = handlers
    assert request.handler_context is not None
    assert request.handler_context.traceparent == (
        f"00-{TRACE}-{inv.context.span_id:016x}-01"
    )
    assert msg.start_time is not None
    assert claim.start_time is not None
    assert inv.start_time is not None
    assert msg.start_time <= claim.start_time <= inv.start_time


async def test_a_failed_attempt_is_an_error_and_its_retry_a_new_message_span() -> None:
    t = Traced()
    t.world.function("users", USERS)
    t.world.runtime.script["users/events.created.handler"] = InvocationResult(
        ok=False, error="boom", exit_code=3
    )
    message = await t.deliver(INSERT)
    inv = one(t.spans("relay.invocation"))
    assert inv.status.status_code == StatusCode.ERROR
    assert inv.status.description == "boom"
    assert attr(inv, "relay.exit_code") == 3
    msg = one(t.spans("relay.message"))
    assert msg.parent is None  # no traceparent: the message starts the trace
    assert [e.name for e in msg.events] == ["classified", "retry_scheduled"]
    assert dict(msg.events[1].attributes or {}) == {
        "relay.function": "users",
        "relay.handler": "events.created.handler",
        "relay.attempt": 1,
        "relay.retry_in_s": 60.0,
    }
    assert attr(msg, "relay.outcome") == "retrying"
    # the redelivery is a second message span; the retry's attempt says 2
    t.world.clock.advance(60)
    t.world.expire_deadlines(message.id)
    again = msgspec.structs.replace(message, deliveries=2, reclaimed=True)
    t.traces.read(again, "events")
    await t.bus.send(DispatchMessage(message=again))
    attempts = [attr(s, "relay.attempt") for s in t.spans("relay.invocation")]
    assert attempts == [1, 2]
    assert len(t.spans("relay.message")) == 2
    last = t.spans("relay.message")[-1]
    assert attr(last, "relay.outcome") == "dead_lettered"
    assert last.status.status_code == StatusCode.ERROR
    assert [e.name for e in last.events] == ["exhausted", "dead_lettered"]


async def test_an_unmatched_message_has_its_span_without_invocations() -> None:
    t = Traced()
    t.world.function("users", USERS)
    await t.deliver(b'{"table": "orders"}', GOOD)
    msg = one(t.spans("relay.message"))
    assert attr(msg, "relay.outcome") == "unmatched"
    assert t.spans("relay.invocation") == []
    assert parent_of(one(t.spans("relay.claim"))) == msg.context.span_id


async def test_a_no_op_tracer_hands_the_handler_the_producers_traceparent() -> None:
    traces = DeliveryTraces(NoOpTracer())
    context = HandlerContext(message_id="1-1", traceparent=GOOD)
    request = InvocationRequest(function="f", handler="h", event=b"{}", handler_context=context)
    _, traceparent = traces.start_invocation(request)
    assert traceparent == GOOD


async def test_open_spans_are_bounded_and_shutdown_ends_the_rest() -> None:
    t = Traced(max_open=2)
    for i in range(3):
        t.traces.read(StreamMessage(id=f"1-{i}", payload=INSERT), "events")
    [evicted] = t.spans("relay.message")
    assert (attr(evicted, "relay.message_id"), attr(evicted, "relay.outcome")) == (
        "1-0", "abandoned"
    )
    t.traces.close()
    outcomes = [attr(s, "relay.outcome") for s in t.spans("relay.message")]
    assert outcomes == ["abandoned", "shutdown", "shutdown"]


async def test_the_traced_stream_opens_a_span_per_message_read() -> None:
    t = Traced()
    t.world.stream.add(INSERT)
    t.world.stream.add(INSERT)
    read = await t.stream.read(10, 0)
    t.traces.close()
    assert [attr(s, "relay.message_id") for s in t.spans("relay.message")] == [
        m.id for m in read
    ]


async def test_a_ledger_outage_is_an_error_claim_and_the_message_stays_pending() -> None:
    t = Traced()
    t.world.function("users", USERS)
    t.world.ledger.fail_next.add("begin")
    await t.deliver(INSERT, GOOD)
    claim = one(t.spans("relay.claim"))
    assert claim.status.status_code == StatusCode.ERROR
    assert claim.status.description == (
        "redis ledger script begin failed: connection refused"
    )
    assert t.spans("relay.invocation") == []
    assert attr(one(t.spans("relay.message")), "relay.outcome") == "claim_failed"
