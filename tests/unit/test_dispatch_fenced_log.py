"""A result the ledger rejects (a newer attempt took the invocation over) is logged.

The handler's own result is logged when it returns; without this line an operator
reading the log of the late worker would see an ``invocation_succeeded`` (or a
failure with a retry) that never counted.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from relay.application.dispatch import MessageReport
from relay.domain.execution import InvocationRequest, InvocationResult
from relay.domain.invocation import Running, format_marker, parse_marker
from tests.unit.delivery_world import World, rule

pytestmark = pytest.mark.anyio

FIELD = "users/events.created.handler"


def users_world() -> World:
    world = World()
    world.function("users", {"events": [rule("events.created.handler", {"table": ["users"]})]})
    return world


async def deliver_with_a_takeover() -> tuple[MessageReport, list[MutableMapping[str, Any]]]:
    """Deliver one event whose claim is taken over by attempt 2 while it runs."""
    world = users_world()

    def taken_over(request: InvocationRequest) -> InvocationResult:
        # While this worker runs, its claim expires and another worker claims attempt 2.
        hashes = world.ledger.hashes[request.context]
        marker = parse_marker(hashes[FIELD])
        assert isinstance(marker, Running)
        hashes[FIELD] = format_marker(Running(marker.deadline_ms, marker.attempt + 1, "other"))
        return InvocationResult(ok=True)

    world.runtime.script[FIELD] = taken_over
    with capture_logs() as logs:
        report = await world.deliver(b'{"table": "users"}')
    return report, logs


async def test_a_fenced_result_is_logged_with_its_attempt() -> None:
    report, logs = await deliver_with_a_takeover()
    fenced = [entry for entry in logs if entry["event"] == "invocation_fenced"]
    assert fenced == [
        {
            "event": "invocation_fenced",
            "log_level": "warning",
            "function": "users",
            "handler": "events.created.handler",
            "message_id": report.message_id,
            "attempt": 1,
        }
    ]


async def test_a_fenced_result_is_not_logged_as_a_success() -> None:
    _, logs = await deliver_with_a_takeover()
    names = [entry["event"] for entry in logs]
    assert "invocation_fenced" in names
    assert "invocation_succeeded" not in names


async def test_an_accepted_result_is_logged_once() -> None:
    world = users_world()
    with capture_logs() as logs:
        await world.deliver(b'{"table": "users"}')
    succeeded = [entry for entry in logs if entry["event"] == "invocation_succeeded"]
    assert len(succeeded) == 1
    assert succeeded[0]["attempt"] == 1
    assert succeeded[0]["function"] == "users"
