"""The command bus: one handler per command, events to every subscriber."""

from __future__ import annotations

import warnings

import anyio
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


def greeter(bus: MessageBus) -> None:
    async def greet(cmd: Greet) -> Outcome[str]:
        bus.emit(Greeted(name=cmd.name))
        return Outcome(f"hello {cmd.name}")

    bus.register(Greet, greet)


async def test_send_returns_result_and_drains_what_the_handler_emitted() -> None:
    seen: list[str] = []
    async_seen: list[str] = []

    async def async_subscriber(event: Greeted) -> None:
        async_seen.append(event.name)

    bus = MessageBus({}, {Greeted: [lambda e: seen.append(e.name)]})
    greeter(bus)
    bus.subscribe(Greeted, async_subscriber)
    assert await bus.send(Greet(name="ada")) == "hello ada"
    assert seen == ["ada"]
    assert async_seen == ["ada"]


async def test_an_asynchronous_subscriber_waits_for_a_drain_in_emit_order() -> None:
    seen: list[str] = []

    async def async_subscriber(event: Greeted) -> None:
        seen.append(event.name)

    bus = MessageBus({}, {Greeted: [async_subscriber]})
    bus.emit(Greeted(name="a"))
    bus.emit(Greeted(name="b"))
    assert seen == []  # queued: emitting never blocks nor awaits
    await bus.drain()
    assert seen == ["a", "b"]


async def test_the_events_loop_drains_as_soon_as_something_is_queued() -> None:
    seen = anyio.Event()

    async def async_subscriber(_event: Greeted) -> None:
        seen.set()

    bus = MessageBus({}, {Greeted: [async_subscriber]})
    async with anyio.create_task_group() as tg:
        await tg.start(bus.run)
        bus.emit(Greeted(name="c"))
        with anyio.fail_after(5):
            await seen.wait()
        tg.cancel_scope.cancel()


async def test_unknown_command_is_an_error() -> None:
    bus = MessageBus({})
    with pytest.raises(UnknownCommand, match="Forgotten"):
        await bus.send(Forgotten())


async def test_failing_subscriber_never_breaks_the_command() -> None:
    later: list[str] = []

    def broken(_event: Greeted) -> None:
        raise RuntimeError("observer bug")

    bus = MessageBus({}, {Greeted: [broken, lambda e: later.append(e.name)]})
    greeter(bus)
    assert await bus.send(Greet(name="bo")) == "hello bo"
    assert later == ["bo"]


def test_emit_hands_an_event_to_its_synchronous_subscribers_at_once() -> None:
    seen: list[str] = []

    def broken(_event: Greeted) -> None:
        raise RuntimeError("observer bug")

    bus = MessageBus({}, {Greeted: [broken, lambda e: seen.append(e.name)]})
    with capture_logs() as logs:
        bus.emit(Greeted(name="cy"))
    assert seen == ["cy"]  # a subscriber that raised did not stop the next one
    assert [entry["event"] for entry in logs] == ["subscriber_failed"]


def test_emit_skips_a_subscriber_that_returns_an_awaitable_with_an_error_line() -> None:
    ran: list[str] = []

    async def async_subscriber(event: Greeted) -> None:
        ran.append(event.name)

    # a lambda hides the coroutine function: it is taken for a synchronous subscriber
    bus = MessageBus({}, {Greeted: [lambda e: async_subscriber(e)]})  # noqa: PLW0108
    with capture_logs() as logs, warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine left unawaited would warn
        bus.emit(Greeted(name="di"))
    assert ran == []
    assert logs == [
        {"event": "subscriber_not_synchronous", "event_type": "Greeted", "log_level": "error"}
    ]


def test_commands_and_events_are_frozen() -> None:
    cmd = Greet(name="x")
    with pytest.raises(AttributeError):
        cmd.name = "y"  # type: ignore[misc]


async def test_a_command_never_waits_behind_another_drain() -> None:
    release = anyio.Event()
    seen: list[str] = []

    async def slow_state_view(event: Greeted) -> None:
        if event.name == "first":
            await release.wait()
        seen.append(event.name)

    bus = MessageBus({}, {Greeted: [slow_state_view]})
    greeter(bus)
    async with anyio.create_task_group() as tg:
        bus.emit(Greeted(name="first"))
        tg.start_soon(bus.drain)  # held by the slow subscriber
        await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(5):
            assert await bus.send(Greet(name="second")) == "hello second"  # did not wait
        assert seen == []
        release.set()
    assert seen == ["first", "second"]  # the running drain delivered both, in order
