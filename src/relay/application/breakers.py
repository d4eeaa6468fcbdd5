"""Every function's circuit breaker on this worker, and its control commands.

The dispatcher asks :meth:`BreakerBoard.admit` right before an invocation would
take its concurrency slot; a held invocation is released like one that found no
slot (no attempt charged, the message stays pending, the recovery loop hands it
back later). Once the ledger accepted (or rejected) the results, the dispatcher
reports each one with :meth:`BreakerBoard.record`. The rules are
:mod:`relay.domain.breaker`; this module keeps the states, applies the clock and
publishes a domain event on every transition (logged by
:func:`subscribe_breaker_log`, counted by the metrics). State is per worker and
in memory: a restarted worker starts with every breaker closed.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog

from relay.application.bus import Emit, Handler, MessageBus, Outcome
from relay.application.ports import CatalogSource, Clock
from relay.domain import breaker as rules
from relay.domain import events as ev
from relay.domain.breaker import BreakerChange, BreakerPolicy, BreakerState
from relay.domain.commands import Command, ForceBreaker, GetBreaker
from relay.domain.errors import RelayError
from relay.domain.invocation import Complete, Exhaust, Retry, Transition
from relay.domain.messages import DomainEvent

_log = structlog.get_logger("relay.application.breakers")
_CLEAN = BreakerState()  # closed, nothing counted (frozen: one shared instance)


class UnknownBreakerTarget(RelayError):
    """A breaker command named a function the worker does not have, or a bad state."""


class BreakerSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What ``relay function inspect`` shows: ``state`` and, while open, the
    seconds until the probe (``None`` when forced or not open)."""

    state: str
    enabled: bool
    forced: bool = False
    failures: int = 0  # consecutive failures counted while closed
    cooldown_s: float = 0.0
    probe_in_s: float | None = None


class BreakerBoard:
    """The per-function breakers of one worker (keyed by function name)."""

    def __init__(
        self,
        *,
        clock: Clock,
        registry: CatalogSource,
        emit: Emit,
    ) -> None:
        self._clock = clock
        self._registry = registry
        self._emit = emit
        self._states: dict[str, BreakerState] = {}

    def admit(self, function: str, policy: BreakerPolicy | None, key: str) -> bool:
        """Whether invocation ``key`` (``message_id/field``) of ``function`` may run."""
        current = self._states.get(function)
        if current is None:
            return True  # closed with nothing counted (or no breaker): the usual case
        decision, state, change = rules.admit(
            current, policy, self._clock.monotonic(), key
        )
        self._apply(function, state, change, message_id=key.partition("/")[0])
        return decision != "hold"

    def record(
        self, function: str, policy: BreakerPolicy | None, key: str, ok: bool | None
    ) -> None:
        """The result of ``key``: succeeded, failed (timeouts included), or ``None``
        (released, fenced or lost: it does not count)."""
        current = self._states.get(function)
        if current is None and (policy is None or ok is not False):
            return  # closed with nothing counted stays so unless this is a failure
        state, change = rules.record(
            current or _CLEAN, policy, self._clock.monotonic(), key, ok
        )
        self._apply(function, state, change)

    @property
    def holding(self) -> bool:
        """Whether any function's breaker is anything but closed and clean (a forced
        one included, whatever its template says)."""
        return bool(self._states)

    def forget(self, function: str) -> None:
        """A removed function's breaker goes with it (added again, it starts closed)."""
        self._states.pop(function, None)

    def snapshot(self, function: str) -> BreakerSnapshot:
        current = self._states.get(function, _CLEAN)
        retry_at = current.retry_at()
        probe_in = None if retry_at is None else max(0.0, retry_at - self._clock.monotonic())
        return BreakerSnapshot(
            state=current.state,
            enabled=self._policy(function) is not None,
            forced=current.forced,
            failures=len(current.failures),
            cooldown_s=current.cooldown_s,
            probe_in_s=probe_in,
        )

    # --- control commands -----------------------------------------------------------

    async def get(self, command: GetBreaker) -> Outcome[BreakerSnapshot]:
        self._known(command.function)
        return Outcome(self.snapshot(command.function))

    async def force(self, command: ForceBreaker) -> Outcome[BreakerSnapshot]:
        if command.state not in {rules.OPEN, rules.CLOSED}:
            raise UnknownBreakerTarget(
                f'breaker state must be "open" or "closed" (got "{command.state}")'
            )
        self._known(command.function)
        function = command.function
        state, change = rules.force(
            self._states.get(function, _CLEAN),
            self._policy(function),
            self._clock.monotonic(),
            open_=command.state == rules.OPEN,
        )
        self._apply(function, state, change)
        return Outcome(self.snapshot(function))

    def table(self) -> dict[type[Command], Handler]:
        """The bus handler table entries for the breaker commands."""
        return {GetBreaker: self.get, ForceBreaker: self.force}

    # --- internals ----------------------------------------------------------------

    def _known(self, function: str) -> None:
        if function not in self._registry.current().functions:
            raise UnknownBreakerTarget(f'function "{function}" not found on the worker')

    def _policy(self, function: str) -> BreakerPolicy | None:
        fn = self._registry.current().functions.get(function)
        return None if fn is None else fn.template.breaker

    def _apply(
        self, function: str, state: BreakerState, change: BreakerChange | None, message_id: str = ""
    ) -> None:
        if state is _CLEAN or state == _CLEAN:
            self._states.pop(function, None)  # closed and clean: nothing to keep
        else:
            self._states[function] = state
        if change is not None:
            self._emit(_event(function, change, message_id))


def _event(function: str, change: BreakerChange, message_id: str) -> DomainEvent:
    if change.state == rules.OPEN:
        return ev.BreakerOpened(
            function=function,
            cause=change.cause,
            failures=change.failures,
            cooldown_s=change.cooldown_s,
        )
    if change.state == rules.HALF_OPEN:
        return ev.BreakerHalfOpened(function=function, message_id=message_id)
    return ev.BreakerClosed(function=function, cause=change.cause)


def _opened(e: ev.BreakerOpened) -> None:
    _log.warning(
        "breaker_opened",
        function=e.function,
        cause=e.cause,
        failures=e.failures,
        cooldown_s=e.cooldown_s,
    )


def _half_opened(e: ev.BreakerHalfOpened) -> None:
    _log.info("breaker_half_open", function=e.function, message_id=e.message_id)


def _closed(e: ev.BreakerClosed) -> None:
    _log.info("breaker_closed", function=e.function, cause=e.cause)


def subscribe_breaker_log(bus: MessageBus) -> None:
    """One log line per transition: ``breaker_opened``, ``breaker_half_open``,
    ``breaker_closed``."""
    subscribers: dict[type[DomainEvent], Any] = {
        ev.BreakerOpened: _opened,
        ev.BreakerHalfOpened: _half_opened,
        ev.BreakerClosed: _closed,
    }
    for kind, subscriber in subscribers.items():
        bus.subscribe(kind, subscriber)


def counted_result(transition: Transition) -> bool | None:
    """What a recorded attempt tells the breaker: a success, a failure (retry or
    exhaustion, a timeout included), or nothing (a release)."""
    if isinstance(transition, Complete):
        return True
    if isinstance(transition, Retry | Exhaust):
        return False
    return None
