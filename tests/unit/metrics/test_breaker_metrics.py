"""``function_breaker_state`` and ``function_breaker_transitions_total`` follow the
breaker's domain events."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from relay.adapters.metrics.breakers import subscribe_breakers
from relay.application.bus import MessageBus
from relay.domain import events as ev


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_state_and_transitions_follow_the_events() -> None:
    registry = CollectorRegistry()
    bus = MessageBus({})
    subscribe_breakers(bus, registry)
    assert value(registry, "function_breaker_state", function="pay") is None
    bus.emit(ev.BreakerOpened(function="pay", cause="failures", failures=5, cooldown_s=30))
    assert value(registry, "function_breaker_state", function="pay") == 2
    bus.emit(ev.BreakerHalfOpened(function="pay", message_id="1-0"))
    assert value(registry, "function_breaker_state", function="pay") == 1
    bus.emit(ev.BreakerOpened(function="pay", cause="probe_failed", failures=1, cooldown_s=60))
    bus.emit(ev.BreakerHalfOpened(function="pay", message_id="2-0"))
    bus.emit(ev.BreakerClosed(function="pay", cause="probe_succeeded"))
    assert value(registry, "function_breaker_state", function="pay") == 0
    transitions = "function_breaker_transitions_total"
    assert value(registry, transitions, function="pay", state="open") == 2
    assert value(registry, transitions, function="pay", state="half_open") == 2
    assert value(registry, transitions, function="pay", state="closed") == 1


def test_a_removed_function_loses_its_breaker_series() -> None:
    registry = CollectorRegistry()
    bus = MessageBus({})
    subscribe_breakers(bus, registry)
    bus.emit(ev.BreakerOpened(function="pay", cause="failures", failures=5, cooldown_s=30))
    bus.emit(ev.FunctionRemoved(name="pay", at=0.0))
    assert value(registry, "function_breaker_state", function="pay") is None
    assert value(registry, "function_breaker_transitions_total", function="pay",
                 state="open") is None
    bus.emit(ev.FunctionRemoved(name="never-moved", at=0.0))  # nothing to remove: no error
