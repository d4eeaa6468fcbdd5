"""The command bus: one handler per command, any number of subscribers per event.

A handler returns an :class:`Outcome`: the result the caller asked for plus the
domain events it produced. The bus hands those events to every subscriber of their
type. Subscribers observe (state view, metrics, logs); they never decide
behaviour, so a subscriber that raises is logged and the command still succeeds.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog

from relay.domain.messages import Command, DomainEvent

R = TypeVar("R")
C = TypeVar("C", bound=Command)

_log = structlog.get_logger("relay.bus")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[R]):
    """What a command handler returns: its result and the events it produced."""

    result: R
    events: Sequence[DomainEvent] = field(default_factory=tuple)


Handler = Callable[[Any], Awaitable[Outcome[Any]]]
Subscriber = Callable[[Any], Awaitable[None] | None]


class UnknownCommand(LookupError):
    """A command was sent that no handler is registered for."""


class MessageBus:
    """Routes commands to their one handler and events to their subscribers."""

    def __init__(
        self,
        handlers: Mapping[type[Command], Handler],
        subscribers: Mapping[type[DomainEvent], Iterable[Subscriber]] | None = None,
    ) -> None:
        self._handlers = dict(handlers)
        self._subscribers: dict[type[DomainEvent], list[Subscriber]] = {
            kind: list(subs) for kind, subs in (subscribers or {}).items()
        }

    @property
    def handled_commands(self) -> frozenset[type[Command]]:
        return frozenset(self._handlers)

    def register(self, kind: type[Command], handler: Handler) -> None:
        """Add the one handler for ``kind``; a second handler is a wiring bug."""
        if kind in self._handlers:
            raise ValueError(f"{kind.__name__} already has a handler")
        self._handlers[kind] = handler

    def subscribe(self, kind: type[DomainEvent], subscriber: Subscriber) -> None:
        self._subscribers.setdefault(kind, []).append(subscriber)

    async def send(self, command: Command) -> Any:
        """Run the command's handler, publish its events, return its result."""
        handler = self._handlers.get(type(command))
        if handler is None:
            raise UnknownCommand(type(command).__name__)
        outcome = await handler(command)
        await self.publish(outcome.events)
        return outcome.result

    def notify(self, event: DomainEvent) -> None:
        """Hand ``event`` to its subscribers now, from synchronous code (an adapter's
        callback, e.g. the runtime's pool events). Such events can only have
        synchronous subscribers: an async one is a wiring bug, logged and skipped."""
        for subscriber in self._subscribers.get(type(event), ()):
            try:
                maybe = subscriber(event)
            except Exception:  # noqa: BLE001 - observers must never break the caller
                _log.exception("subscriber_failed", event_type=type(event).__name__)
                continue
            if maybe is not None and inspect.isawaitable(maybe):
                close = getattr(maybe, "close", None)
                if close is not None:
                    close()  # never awaited: no "coroutine was never awaited" warning
                _log.error("subscriber_not_synchronous", event_type=type(event).__name__)

    async def publish(self, events: Iterable[DomainEvent]) -> None:
        for event in events:
            for subscriber in self._subscribers.get(type(event), ()):
                try:
                    maybe = subscriber(event)
                    if maybe is not None and inspect.isawaitable(maybe):
                        await maybe
                except Exception:  # noqa: BLE001 - observers must never break a command
                    _log.exception("subscriber_failed", event_type=type(event).__name__)
