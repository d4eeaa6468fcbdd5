"""The command bus: one handler per command, any number of subscribers per event.

A handler returns an :class:`Outcome` holding only the result the caller asked
for. Facts leave a handler one way: :meth:`MessageBus.emit`, the one event sink
(handlers, the loops and the adapters' callbacks are given it as ``emit``).

The bus drains the sink to subscribers. A synchronous subscriber (a metric, a log
line) sees a fact the moment it is emitted, from any code, the dispatcher's hot
path included; an asynchronous one (the state view's writes) is queued and the
queue is drained, in emit order, when the command that emitted it ends (unless a
drain is already running, which delivers it) and, in a running worker, by
:meth:`MessageBus.run` as soon as it is woken (a full reconcile pass takes
minutes and operators see each function become pending, then ready).
Subscribers observe; they never decide behaviour, so a subscriber that raises is
logged and the command still succeeds.

The bus also remembers which command is running (a context variable, inherited by
the tasks the handler starts), and tells an optional ``audit`` of every emitted
fact and the command it was emitted under: the composition test holds each state
change to its command that way.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio
import structlog
from anyio.abc import TaskStatus

from relay.domain.messages import Command, DomainEvent

R = TypeVar("R")
C = TypeVar("C", bound=Command)

_log = structlog.get_logger("relay.bus")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[R]):
    """What a command handler returns: its result. Events go to the sink, never here."""

    result: R


Handler = Callable[[Any], Awaitable[Outcome[Any]]]
Subscriber = Callable[[Any], Awaitable[None] | None]
Emit = Callable[[DomainEvent], None]
"""The event sink as the emitting code sees it: ``bus.emit``."""
Send = Callable[[Command], Awaitable[Any]]
"""How a use case or a loop orders a change it decided: ``bus.send``."""
Audit = Callable[[DomainEvent, Command | None], None]

_running: ContextVar[Command | None] = ContextVar("relay_command", default=None)


class UnknownCommand(LookupError):
    """A command was sent that no handler is registered for."""


class MessageBus:
    """Routes commands to their one handler and emitted events to their subscribers."""

    def __init__(
        self,
        handlers: Mapping[type[Command], Handler],
        subscribers: Mapping[type[DomainEvent], Iterable[Subscriber]] | None = None,
        *,
        audit: Audit | None = None,
    ) -> None:
        self._handlers = dict(handlers)
        self._sync: dict[type[DomainEvent], list[Subscriber]] = {}
        self._async: dict[type[DomainEvent], list[Subscriber]] = {}
        for kind, subs in (subscribers or {}).items():
            for sub in subs:
                self.subscribe(kind, sub)
        self._queue: deque[DomainEvent] = deque()
        # made at first use: both need the running event loop, the bus is built before
        self._draining: anyio.Lock | None = None
        self._wake: anyio.Event | None = None
        self._audit = audit

    @property
    def handled_commands(self) -> frozenset[type[Command]]:
        return frozenset(self._handlers)

    def register(self, kind: type[Command], handler: Handler) -> None:
        """Add the one handler for ``kind``; a second handler is a wiring bug."""
        if kind in self._handlers:
            raise ValueError(f"{kind.__name__} already has a handler")
        self._handlers[kind] = handler

    def subscribe(self, kind: type[DomainEvent], subscriber: Subscriber) -> None:
        """Observe ``kind``: a coroutine function is queued, anything else is called
        as the fact is emitted (it must not return an awaitable)."""
        table = self._async if inspect.iscoroutinefunction(subscriber) else self._sync
        table.setdefault(kind, []).append(subscriber)

    async def send(self, command: Command) -> Any:
        """Run the command's handler, drain what it emitted, return its result."""
        handler = self._handlers.get(type(command))
        if handler is None:
            raise UnknownCommand(type(command).__name__)
        token = _running.set(command)
        try:
            outcome = await handler(command)
        finally:
            _running.reset(token)
            await self.drain()
        return outcome.result

    def emit(self, event: DomainEvent) -> None:
        """The one event sink. Never blocks, never raises (an observer's failure is
        logged), callable from synchronous code."""
        if self._audit is not None:
            self._audit(event, _running.get())
        kind = type(event)
        for subscriber in self._sync.get(kind, ()):
            _call_sync(subscriber, event)
        if kind in self._async:
            self._queue.append(event)
            if self._wake is not None:
                self._wake.set()

    async def drain(self) -> None:
        """Hand every queued fact to its asynchronous subscribers, in emit order.

        Returns at once when nothing is queued (the delivery hot path's case) or
        when a drain is already running: that one delivers what was queued since,
        so a command's end never waits behind another command's state writes."""
        if not self._queue:
            return
        if self._draining is None:
            self._draining = anyio.Lock()
        if self._draining.locked():
            return
        async with self._draining:
            while self._queue:
                event = self._queue.popleft()
                for subscriber in self._async.get(type(event), ()):
                    try:
                        await subscriber(event)  # type: ignore[misc]
                    except Exception:  # noqa: BLE001 - observers must never break a command
                        _log.exception("subscriber_failed", event_type=type(event).__name__)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The worker's ``events`` loop: drain whenever something was queued."""
        task_status.started()
        while True:
            self._wake = anyio.Event()
            await self.drain()  # what was queued before this loop ran, or woke it
            await self._wake.wait()


def _call_sync(subscriber: Subscriber, event: DomainEvent) -> None:
    try:
        maybe = subscriber(event)
    except Exception:  # noqa: BLE001 - observers must never break the emitter
        _log.exception("subscriber_failed", event_type=type(event).__name__)
        return
    if maybe is not None and inspect.isawaitable(maybe):
        close = getattr(maybe, "close", None)
        if close is not None:
            close()  # never awaited: no "coroutine was never awaited" warning
        _log.error("subscriber_not_synchronous", event_type=type(event).__name__)
