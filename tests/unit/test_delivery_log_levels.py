"""The hot delivery lines a level hides are not subscribed (no cost per event)."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
import structlog

from relay.application.bus import MessageBus
from relay.application.delivery_log import LINES, subscribe_delivery_log
from relay.domain import events as ev
from relay.entrypoints.logging import configure_logging


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


class RecordingBus(MessageBus):
    def __init__(self) -> None:
        super().__init__({})
        self.kinds: list[type] = []

    def subscribe(self, kind: type, subscriber: object) -> None:
        self.kinds.append(kind)


@pytest.mark.parametrize(
    ("level", "left_out"),
    [
        ("DEBUG", set()),
        ("INFO", {ev.InvocationStarted}),
        ("WARN", {ev.InvocationStarted, ev.InvocationSucceeded}),
        ("ERROR", {ev.InvocationStarted, ev.InvocationSucceeded}),
    ],
)
def test_only_the_hidden_hot_lines_are_left_out(level: str, left_out: set[type]) -> None:
    configure_logging(level, stream=io.StringIO())
    bus = RecordingBus()
    subscribe_delivery_log(bus)
    assert set(LINES) - set(bus.kinds) == left_out
    # every warning and error line stays, whatever the level
    assert {ev.InvocationFailed, ev.InvocationExhausted, ev.InvocationDeferred} <= set(bus.kinds)
