"""The breaker series, fed by the breaker's domain events.

``function_breaker_state{function}``: 0 closed, 1 half-open, 2 open (see
``relay.domain.breaker.STATE_VALUES``); a function whose breaker never left
``closed`` on this worker has no sample. ``function_breaker_transitions_total
{function,state}`` counts every transition by the state it went to.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge

from relay.application.bus import MessageBus
from relay.domain import events as ev
from relay.domain.breaker import CLOSED, HALF_OPEN, OPEN, STATE_VALUES


def subscribe_breakers(bus: MessageBus, registry: CollectorRegistry) -> None:
    """Register the two breaker series on ``registry`` and feed them from ``bus``."""
    state = Gauge(
        "function_breaker_state",
        "Circuit breaker per function on this worker: 0 closed, 1 half-open, 2 open.",
        ["function"],
        registry=registry,
    )
    transitions = Counter(
        "function_breaker_transitions",
        "Circuit breaker transitions on this worker, by the state entered.",
        ["function", "state"],
        registry=registry,
    )

    def moved(function: str, to: str) -> None:
        state.labels(function=function).set(STATE_VALUES[to])
        transitions.labels(function=function, state=to).inc()

    def removed(e: ev.FunctionRemoved) -> None:
        # like every per-function series: a removed function's series go with it
        for labelled, labels in ((state, ()), *((transitions, (to,)) for to in STATE_VALUES)):
            with contextlib.suppress(KeyError):  # never moved: no such series
                labelled.remove(e.name, *labels)

    bus.subscribe(ev.FunctionRemoved, removed)
    bus.subscribe(ev.BreakerOpened, lambda e: moved(e.function, OPEN))
    bus.subscribe(ev.BreakerHalfOpened, lambda e: moved(e.function, HALF_OPEN))
    bus.subscribe(ev.BreakerClosed, lambda e: moved(e.function, CLOSED))
