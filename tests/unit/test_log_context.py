"""message_id, function, handler and attempt are bound as log context while a
message is dispatched, so lines from any layer carry them."""

from __future__ import annotations

from typing import Any

import pytest

from relay.application.log_context import log_context, merge_log_context
from relay.domain.execution import InvocationRequest, InvocationResult
from tests.unit.delivery_world import World, rule

pytestmark = pytest.mark.anyio


async def test_an_attempt_runs_with_its_message_function_handler_and_attempt_bound() -> None:
    world = World()
    world.function("users", {"events": [rule("h.handler", {"table": ["users"]})]})
    seen: list[dict[str, Any]] = []

    def record(_request: InvocationRequest) -> InvocationResult:
        seen.append(dict(merge_log_context(None, "info", {})))
        return InvocationResult(ok=True)

    world.runtime.script["users/h.handler"] = record
    report = await world.deliver(b'{"table": "users"}')
    assert seen == [
        {"message_id": report.message_id, "function": "users", "handler": "h.handler", "attempt": 1}
    ]
    assert dict(merge_log_context(None, "info", {})) == {}  # nothing leaks past the dispatch


def test_the_processor_adds_bound_fields_without_overriding_a_lines_own() -> None:
    with log_context(message_id="1-0", attempt=2):
        line = merge_log_context(None, "info", {"event": "x", "attempt": 3})
    assert line == {"event": "x", "attempt": 3, "message_id": "1-0"}
    assert merge_log_context(None, "info", {"event": "y"}) == {"event": "y"}
