"""The handler of ``ConvergeServices``: one pass over a serving function's services.

The reconciler decides when a function's services must converge (after each
reconcile of a version that serves) and sends the command; this handler runs
the pass through :class:`relay.application.services.ServiceConverger` and emits
what changed (``ServicesConverged``, and the version failed or confirmed again).
Without a service converger (a worker process other than the first, or a unit
test without services) there is nothing to converge.
"""

from __future__ import annotations

from relay.application.bus import Emit, Outcome
from relay.application.function_summary import summarize
from relay.application.registry import FunctionRegistry
from relay.application.services import ServiceConverger
from relay.domain.commands import ConvergeServices


class ServiceConvergence:
    """Handler of :class:`ConvergeServices`; the result is whether a problem remains."""

    def __init__(
        self, *, registry: FunctionRegistry, services: ServiceConverger | None, emit: Emit
    ) -> None:
        self._registry = registry
        self._services = services
        self._emit = emit

    async def __call__(self, command: ConvergeServices) -> Outcome[bool]:
        current = self._registry.get(command.function)
        if self._services is None or current is None or not current.ready:
            return Outcome(False)
        if command.healing:
            problems, events = await self._services.converge(
                current.name, current.directory, current.template, current.image or None
            )
            failed = bool(problems)
        else:
            failed, events = await self._services.converge_version(
                current, summarize(current.template), fresh=command.fresh
            )
        for event in events:
            self._emit(event)
        return Outcome(failed)
