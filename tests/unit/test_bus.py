"""The command bus: one handler per command, events to every subscriber."""

from __future__ import annotations

import warnings

import pytest
from structlog.testing import capture_logs

from relay.application.bus import MessageBus, Outcome, UnknownCommand
from relay.domain.messages import Command, DomainEvent

pytestmark = pytest.mark.anyio


class Greet(Command, frozen=True, kw_only=True):
    name: str


class Greeted(DomainEvent, frozen=True, kw_only=True):
    name: str


class Forgotten(Command, frozen=True, kw_only=True):
    pass


async def greet(cmd: Greet) -> Outcome[str]:
    return Outcome(f"hello {cmd.name}", [Greeted(name=cmd.name)])


async def test_send_returns_result_and_publishes_events() -> None:
    seen: list[str] = []
    async_seen: list[str] = []

    async def async_subscriber(event: Greeted) -> None:
        async_seen.append(event.name)

    bus = MessageBus({Greet: greet}, {Greeted: [lambda e: seen.append(e.name)]})
    bus.subscribe(Greeted, async_subscriber)
    assert await bus.send(Greet(name="ada")) == "hello ada"
    assert seen == ["ada"]
    assert async_seen == ["ada"]


async def test_unknown_command_is_an_error() -> None:
    bus = MessageBus({Greet: greet})
    with pytest.raises(UnknownCommand, match="Forgotten"):
        await bus.send(Forgotten())


async def test_failing_subscriber_never_breaks_the_command() -> None:
    later: list[str] = []

    def broken(_event: Greeted) -> None:
        raise RuntimeError("observer bug")

    bus = MessageBus({Greet: greet}, {Greeted: [broken, lambda e: later.append(e.name)]})
    assert await bus.send(Greet(name="bo")) == "hello bo"
    assert later == ["bo"]


def test_notify_hands_an_event_to_its_subscribers_at_once() -> None:
    seen: list[str] = []

    def broken(_event: Greeted) -> None:
        raise RuntimeError("observer bug")

    bus = MessageBus({}, {Greeted: [broken, lambda e: seen.append(e.name)]})
    with capture_logs() as logs:
        bus.notify(Greeted(name="cy"))
    assert seen == ["cy"]  # a subscriber that raised did not stop the next one
    assert [entry["event"] for entry in logs] == ["subscriber_failed"]


def test_notify_skips_an_async_subscriber_with_an_error_line() -> None:
    ran: list[str] = []

    async def async_subscriber(event: Greeted) -> None:
        ran.append(event.name)

    bus = MessageBus({}, {Greeted: [async_subscriber]})
    with capture_logs() as logs, warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine left unawaited would warn
        bus.notify(Greeted(name="di"))
    assert ran == []
    assert logs == [
        {"event": "subscriber_not_synchronous", "event_type": "Greeted", "log_level": "error"}
    ]


def test_commands_and_events_are_frozen() -> None:
    cmd = Greet(name="x")
    with pytest.raises(AttributeError):
        cmd.name = "y"  # type: ignore[misc]
