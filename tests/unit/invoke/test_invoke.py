from __future__ import annotations

import pytest

from relay.adapters.metrics.registry import Metrics
from relay.adapters.metrics.subscribers import subscribe
from relay.application.bus import MessageBus
from relay.application.concurrency import Slots
from relay.application.invoke import FunctionInvoker, FunctionNotFound, FunctionUnavailable
from relay.application.registry import ActiveFunction, FunctionRegistry
from relay.domain.commands import InvokeFunction
from relay.domain.execution import InvocationResult
from relay.domain.template import parse_template
from tests.fakes import (
    FakeClock,
    InMemoryContainerRuntime,
    InMemorySecretStore,
    SequentialTokens,
)

pytestmark = pytest.mark.anyio

TEMPLATE = parse_template(
    {
        "runtime": "python3.14",
        "events": [
            {"handler": "events.created.handler", "pattern": {"event_name": ["INSERT"]}},
            {"handler": "events.any.handler", "pattern": {"table": ["users"]}, "timeout": "20s"},
            {"handler": "events.deleted.handler", "pattern": {"event_name": ["REMOVE"]}},
        ],
        "env": {"API_URL": "https://api.example.com"},
        "secrets": {"TOKEN": "api-token"},
    }
)


def setup(*, image: str | None = "relay-fn-users:abc", last_error: str | None = None) -> tuple[
    MessageBus, InMemoryContainerRuntime, Metrics
]:
    registry = FunctionRegistry()
    registry.put(ActiveFunction(name="users", directory="/functions/users", template=TEMPLATE,
                                runtime="python3.14", image=image, fingerprint="f" * 64,
                                prepared_at=1.0, last_error=last_error))
    runtime = InMemoryContainerRuntime()
    runtime.activate("users", "relay-fn-users:abc", "python3.14", 2)
    bus, metrics = MessageBus({}), Metrics()
    invoker = FunctionInvoker(registry=registry, runtime=runtime, slots=Slots(4),
                              secrets=InMemorySecretStore({"api-token": "s3cret"}),
                              clock=FakeClock(), tokens=SequentialTokens(), emit=bus.emit)
    bus.register(InvokeFunction, invoker)
    subscribe(bus, metrics)
    return bus, runtime, metrics


async def test_runs_matching_rules_in_declaration_order_with_env() -> None:
    bus, runtime, metrics = setup()
    summary = await bus.send(
        InvokeFunction(function="users", event={"event_name": "INSERT", "table": "users"})
    )
    assert (summary.invoked, summary.failed, summary.error) == (2, 0, "")
    assert [r.handler for r in runtime.requests] == ["events.created.handler",
                                                     "events.any.handler"]
    first = runtime.requests[0]
    assert first.env == {"API_URL": "https://api.example.com", "TOKEN": "s3cret"}
    assert first.event == b'{"event_name":"INSERT","table":"users"}'
    assert runtime.requests[1].timeout_ns == 20_000_000_000
    # each run is reported, in order, with the output the command asked to keep
    assert [run.handler for run in summary.handlers] == ["events.created.handler",
                                                         "events.any.handler"]
    assert all(r.capture_output for r in runtime.requests)
    # handler metrics move; the event classification and delivery counters never do
    snap = metrics.snapshot()
    assert snap.total("events_received") == 0
    assert snap.total("handler_success") == 0
    assert metrics.registry.get_sample_value(
        "handler_invocations_total",
        {"outcome": "success", "function": "users", "handler": "events.any.handler"},
    ) == 1


async def test_no_match_runs_nothing() -> None:
    bus, runtime, _ = setup()
    summary = await bus.send(InvokeFunction(function="users", event={"event_name": "X"}))
    assert summary.invoked == 0
    assert runtime.requests == []


async def test_one_failure_does_not_stop_the_others_and_the_first_is_reported() -> None:
    bus, runtime, _ = setup()
    runtime.script["users/events.created.handler"] = InvocationResult(
        ok=False, error='function "users" handler "events.created.handler": boom'
    )
    summary = await bus.send(
        InvokeFunction(function="users", event={"event_name": "INSERT", "table": "users"})
    )
    assert (summary.invoked, summary.failed) == (2, 1)
    assert summary.error == 'function "users" handler "events.created.handler": boom'
    assert len(runtime.requests) == 2


async def test_unknown_and_unavailable_functions_are_errors() -> None:
    bus, _, _ = setup()
    with pytest.raises(FunctionNotFound, match='function "nope" not found'):
        await bus.send(InvokeFunction(function="nope", event={}))
    bus, _, _ = setup(image=None, last_error="build failed: step 3")
    with pytest.raises(FunctionUnavailable, match="not available: build failed: step 3"):
        await bus.send(InvokeFunction(function="users", event={"event_name": "INSERT"}))


async def test_runtime_refusal_is_a_handler_failure() -> None:
    bus, runtime, _ = setup()
    runtime.remove("users")  # the runtime no longer serves it
    summary = await bus.send(InvokeFunction(function="users", event={"event_name": "INSERT"}))
    assert summary.failed == 1
    assert summary.error.startswith('function "users" handler "events.created.handler":')
