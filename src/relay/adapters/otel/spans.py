"""The spans of deliveries, built from what the tracing wrappers and the domain
events observe; the dispatcher itself makes no span call.

A *message* span (``relay.message``) covers one delivery of a stream entry: from
the read until the dispatch settled it (acknowledged, kept pending, lost to
another consumer). Its parent is the producer's ``traceparent`` when the entry
carried one; else it starts a trace. Its children are ``relay.claim`` (the
ledger's begin), one ``relay.invocation`` per attempt run here (with
``relay.container.acquire`` and ``relay.handler`` children) and
``relay.settle`` (the ledger's finish). Classification and dead letters are
span events of the message span.

Open spans are held by message id in a bounded table: a message whose end is
never observed (a crash of the dispatch) is ended as ``abandoned`` when the
table is full, so memory stays bounded whatever happens.
"""

from __future__ import annotations

import contextvars
import time
from collections import OrderedDict
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from relay.application.bus import MessageBus
from relay.domain import events as ev
from relay.domain.execution import InvocationRequest, InvocationResult
from relay.domain.outcome import StreamMessage
from relay.domain.traceparent import traceparent_text

MAX_OPEN_MESSAGES: Final = 10_000
_ERROR_OUTCOMES: Final = frozenset({"dead_lettered", "malformed"})
_propagator = TraceContextTextMapPropagator()


class _Invocation:
    """The invocation span the current task runs (a context variable: the pool's
    and the lease's events are notified from inside ``invoke``, in its task)."""

    __slots__ = ("handler_started_ns", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.handler_started_ns = 0


_current: contextvars.ContextVar[_Invocation | None] = contextvars.ContextVar(
    "relay_invocation_span", default=None
)


class DeliveryTraces:
    """Message and invocation spans of this worker's deliveries (see the module)."""

    def __init__(self, tracer: trace.Tracer, *, max_open: int = MAX_OPEN_MESSAGES) -> None:
        self._tracer = tracer
        self._max_open = max_open
        self._open: OrderedDict[str, Span] = OrderedDict()

    # --- message spans ------------------------------------------------------------
    def read(self, message: StreamMessage, stream: str) -> None:
        """A delivery began: its message span starts (a redelivery starts a new one)."""
        parent = None
        if message.traceparent:
            parent = _propagator.extract({"traceparent": message.traceparent})
        span = self._tracer.start_span(
            "relay.message",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "relay",
                "messaging.destination.name": stream,
                "messaging.message.id": message.id,
                "relay.message_id": message.id,
                "relay.deliveries": message.deliveries,
                "relay.reclaimed": message.reclaimed,
            },
        )
        old = self._open.pop(message.id, None)
        if old is not None:
            _finish(old, "superseded")
        self._open[message.id] = span
        while len(self._open) > self._max_open:
            _, evicted = self._open.popitem(last=False)
            _finish(evicted, "abandoned")

    def ended(self, message_id: str, outcome: str) -> None:
        span = self._open.pop(message_id, None)
        if span is not None:
            _finish(span, outcome)

    def step(self, name: str, message_id: str, start_ns: int, **attributes: Any) -> Span | None:
        """A finished step of a message (``relay.claim``, ``relay.settle``) as its child;
        the caller ends it (with its end time)."""
        parent = self._open.get(message_id)
        if parent is None:
            return None
        context = trace.set_span_in_context(parent)
        return self._tracer.start_span(
            name, context=context, start_time=start_ns, attributes=attributes
        )

    def close(self) -> None:
        """Shutdown: what is still open ends as ``shutdown`` (then flushed)."""
        while self._open:
            _, span = self._open.popitem(last=False)
            _finish(span, "shutdown")

    # --- invocation spans -----------------------------------------------------------
    def start_invocation(self, request: InvocationRequest) -> tuple[_Invocation, str]:
        """The attempt's span (child of its message span, else of the producer's
        context) and the ``TRACEPARENT`` its handler gets."""
        hc = request.handler_context
        message_id = hc.message_id if hc is not None else request.context
        parent_span = self._open.get(message_id)
        if parent_span is not None:
            context = trace.set_span_in_context(parent_span)
        elif hc is not None and hc.traceparent:
            context = _propagator.extract({"traceparent": hc.traceparent})
        else:
            context = None
        attributes: dict[str, Any] = {
            "relay.function": request.function,
            "relay.handler": request.handler,
            "relay.message_id": message_id,
        }
        if hc is not None:
            attributes["relay.attempt"] = hc.attempt
            attributes["relay.invocation_id"] = (
                f"{message_id}/{request.function}/{request.handler}/{hc.attempt}"
            )
            if hc.occurrence_id:
                attributes["relay.occurrence_id"] = hc.occurrence_id
        span = self._tracer.start_span("relay.invocation", context=context, attributes=attributes)
        sc = span.get_span_context()
        if not sc.is_valid:  # a no-op tracer (the SDK disabled): pass the producer's on
            return _Invocation(span), hc.traceparent if hc is not None else ""
        return _Invocation(span), traceparent_text(sc.trace_id, sc.span_id, sc.trace_flags.sampled)

    def enter(self, invocation: _Invocation) -> contextvars.Token[_Invocation | None]:
        return _current.set(invocation)

    def leave(self, token: contextvars.Token[_Invocation | None]) -> None:
        _current.reset(token)

    def end_invocation(
        self, invocation: _Invocation, result: InvocationResult | None, error: str = ""
    ) -> None:
        """The attempt ended with ``result`` (None: the runtime raised ``error``)."""
        span, end_ns = invocation.span, time.time_ns()
        if invocation.handler_started_ns:
            self._child(span, "relay.handler", invocation.handler_started_ns, end_ns)
        if result is None:
            span.set_attribute("relay.outcome", "not_run")
            span.set_status(Status(StatusCode.ERROR, error))
        else:
            span.set_attribute("relay.outcome", "success" if result.ok else "failure")
            span.set_attribute("relay.duration_s", result.duration_s)
            if result.exit_code is not None:
                span.set_attribute("relay.exit_code", result.exit_code)
            if not result.ok:
                span.set_status(Status(StatusCode.ERROR, result.error))
        span.end(end_time=end_ns)

    def _child(self, parent: Span, name: str, start_ns: int, end_ns: int, **attrs: Any) -> None:
        context = trace.set_span_in_context(parent)
        child = self._tracer.start_span(
            name, context=context, start_time=start_ns, attributes=attrs
        )
        child.end(end_time=end_ns)

    # --- domain events ----------------------------------------------------------------
    def acquired(self, e: ev.ContainerAcquired) -> None:
        current = _current.get()
        if current is not None:
            end_ns = time.time_ns()
            start_ns = end_ns - int(e.wait_s * 1e9)
            self._child(
                current.span, "relay.container.acquire", start_ns, end_ns,
                **{"relay.function": e.function, "relay.container.outcome": e.outcome},
            )

    def started(self, _e: ev.InvocationStarted) -> None:
        current = _current.get()
        if current is not None:
            current.handler_started_ns = time.time_ns()

    def annotate(self, message_id: str, name: str, **attributes: Any) -> None:
        """A fact about the message as an event of its span (None values left out)."""
        span = self._open.get(message_id)
        if span is not None:
            span.add_event(name, {k: v for k, v in attributes.items() if v is not None})

    def subscribe(self, bus: MessageBus) -> None:
        """Every event the spans use (all notified synchronously, as they happen)."""
        bus.subscribe(ev.ContainerAcquired, self.acquired)
        bus.subscribe(ev.InvocationStarted, self.started)
        _subscribe_annotations(bus, self.annotate)
        bus.subscribe(ev.MessageAcknowledged, lambda e: self.ended(e.message_id, e.outcome))
        bus.subscribe(ev.MessageKeptPending, lambda e: self.ended(e.message_id, e.reason))
        bus.subscribe(ev.DeliveryLost, lambda e: self.ended(e.message_id, "lost"))


def _subscribe_annotations(bus: MessageBus, note: Any) -> None:
    """The message span's events: what the dispatch decided about it and its attempts."""

    def classified(e: ev.EventClassified) -> None:
        note(e.message_id, "classified",
             **{"relay.matched": e.matched, "relay.functions": list(e.functions)})

    def failed(e: ev.InvocationFailed) -> None:
        note(e.message_id, "retry_scheduled", **_who(e), **{"relay.retry_in_s": e.retry_in_s})

    def exhausted(e: ev.InvocationExhausted) -> None:
        note(e.message_id, "exhausted", **_who(e))

    def deferred(e: ev.InvocationDeferred) -> None:
        note(e.message_id, "deferred", **_who(e), **{"relay.reason": e.reason})

    def dead_lettered(e: ev.MessageDeadLettered) -> None:
        note(e.message_id, "dead_lettered", **_who(e),
             **{"relay.dlq_entry_id": e.entry_id, "relay.reason": e.reason})

    bus.subscribe(ev.EventClassified, classified)
    bus.subscribe(ev.InvocationFailed, failed)
    bus.subscribe(ev.InvocationExhausted, exhausted)
    bus.subscribe(ev.InvocationDeferred, deferred)
    bus.subscribe(ev.MessageDeadLettered, dead_lettered)


def _who(e: Any) -> dict[str, Any]:
    """Function, handler and (when the event has one) attempt."""
    return {
        "relay.function": e.function,
        "relay.handler": e.handler,
        "relay.attempt": getattr(e, "attempt", None),
    }


def _finish(span: Span, outcome: str) -> None:
    span.set_attribute("relay.outcome", outcome)
    if outcome in _ERROR_OUTCOMES:
        span.set_status(Status(StatusCode.ERROR, outcome))
    span.end()
