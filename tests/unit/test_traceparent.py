"""The producer's W3C ``traceparent``: which values are taken, and where they go
(the stream entry's field, the handler's ``TRACEPARENT`` when Relay does not trace)."""

from __future__ import annotations

import msgspec
import pytest
from structlog.testing import capture_logs

from relay.adapters.entry_trace import entry_traceparent
from relay.domain.handler_context import HandlerContext, invocation_env
from relay.domain.traceparent import traceparent_text, valid_traceparent
from tests.unit.delivery_world import World, rule

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "raw",
    [
        GOOD,
        GOOD.encode(),
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",  # not sampled
    ],
)
def test_a_w3c_traceparent_is_taken_as_it_is(raw: str | bytes) -> None:
    text = raw.decode() if isinstance(raw, bytes) else raw
    assert valid_traceparent(raw) == text


def test_a_later_version_is_read_for_its_first_four_fields() -> None:
    later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next"
    assert valid_traceparent(later) == "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        "garbage",
        GOOD.upper(),  # the ids are lower-case hex
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",  # an all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",  # an all-zero parent
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the forbidden version
        GOOD + "-extra",  # version 00 has exactly four fields
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # a short trace id
        b"\xff\xfe",  # not ASCII
        GOOD + "-" + "x" * 300,  # too long to look at
    ],
)
def test_anything_else_is_not_a_traceparent(raw: str | bytes | None) -> None:
    assert valid_traceparent(raw) == ""


def test_a_bad_entry_field_is_ignored_with_a_debug_line_only() -> None:
    with capture_logs() as logs:
        assert entry_traceparent(b"nonsense", "1-1") == ""
        assert entry_traceparent(GOOD.encode(), "1-2") == GOOD
    assert [(e["event"], e["log_level"], e["message_id"]) for e in logs] == [
        ("traceparent_ignored", "debug", "1-1")
    ]


def test_the_text_of_a_span_context() -> None:
    trace_id, span_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
    assert traceparent_text(trace_id, span_id, sampled=True) == GOOD
    assert traceparent_text(1, 2, sampled=False) == "00-" + "0" * 31 + "1-" + "0" * 15 + "2-00"


def test_the_handler_gets_traceparent_only_when_there_is_one() -> None:
    with_one = invocation_env("h", HandlerContext(message_id="1-1", traceparent=GOOD), 0.0)
    without = invocation_env("h", HandlerContext(message_id="1-1"), 0.0)
    assert with_one["TRACEPARENT"] == GOOD
    assert "TRACEPARENT" not in without


@pytest.mark.anyio
async def test_untraced_delivery_passes_the_producers_traceparent_through_unchanged() -> None:
    world = World()
    world.function("users", {"events": [rule("events.created.handler", {"table": ["users"]})]})
    entry = world.stream.add(b'{"table": "users"}')
    [message] = await world.stream.read(1, 0)
    assert message.id == entry
    report = await world.dispatch(msgspec.structs.replace(message, traceparent=GOOD))
    assert report.acknowledged
    [request] = world.runtime.requests
    assert request.handler_context is not None
    assert request.handler_context.traceparent == GOOD
