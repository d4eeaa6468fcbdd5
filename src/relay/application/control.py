"""Handlers of the control commands the socket (and so the CLI) sends.

``GetPoolState`` reads a function's live warm pool, ``ResetStats`` records the
worker-owned reset baseline, ``GetHealth`` reports readiness. ``InvokeFunction``
lives in :mod:`relay.application.invoke`; ``ReplayDeadLetter`` with the DLQ.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from relay.application.bus import Handler, Outcome
from relay.application.ports import PoolReader, StatsResetter
from relay.domain.commands import Command, GetHealth, GetPoolState, ResetStats
from relay.domain.execution import PoolSnapshot


class HealthReport(msgspec.Struct, frozen=True, kw_only=True):
    """``ready`` once started and while no check fails; ``problems`` one line each."""

    ready: bool
    problems: list[str] = msgspec.field(default_factory=list)


class WorkerHealth:
    """What the worker knows of its own health: started, and each dependency's
    state, asked at each report (``watch``: healthy or not; ``explain``: the line)."""

    def __init__(self) -> None:
        self._started = False
        self._probes: dict[str, Callable[[], bool]] = {}
        self._explained: dict[str, Callable[[], str | None]] = {}

    def mark_started(self) -> None:
        self._started = True

    def watch(self, check: str, healthy: Callable[[], bool]) -> None:
        """Ask ``healthy`` at each report (e.g. a loop's ``ConnectionHealth.healthy``)."""
        self._probes[check] = healthy

    def explain(self, check: str, problem: Callable[[], str | None]) -> None:
        """Ask ``problem`` at each report: ``None`` is healthy, else its line."""
        self._explained[check] = problem

    def report(self) -> HealthReport:
        failing: dict[str, str] = {}
        for check, healthy in self._probes.items():
            if not healthy():
                failing.setdefault(check, "unavailable (retrying)")
        for check, problem in self._explained.items():
            detail = problem()
            if detail is not None:
                failing.setdefault(check, detail)
        problems = [f"{check}: {detail}" for check, detail in sorted(failing.items())]
        if not self._started:
            problems.insert(0, "worker: still starting")
        return HealthReport(ready=not problems, problems=problems)


class ControlHandlers:
    """The handlers of ``GetPoolState``, ``ResetStats`` and ``GetHealth``."""

    def __init__(self, *, pools: PoolReader, stats: StatsResetter, health: WorkerHealth) -> None:
        self._pools = pools
        self._stats = stats
        self._health = health

    async def pool_state(self, command: GetPoolState) -> Outcome[PoolSnapshot | None]:
        return Outcome(self._pools.snapshot(command.function))

    async def reset_stats(self, command: ResetStats) -> Outcome[None]:
        await self._stats.reset()
        return Outcome(None)

    async def health(self, command: GetHealth) -> Outcome[HealthReport]:
        return Outcome(self._health.report())

    def table(self) -> dict[type[Command], Handler]:
        """The bus handler table entries for these commands."""
        return {
            GetPoolState: self.pool_state,
            ResetStats: self.reset_stats,
            GetHealth: self.health,
        }
