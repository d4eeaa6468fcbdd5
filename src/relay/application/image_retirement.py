"""Retiring a function's superseded images, one part of a reconcile.

After a swap or a removal (:mod:`relay.application.reconcile`) the function's
images other than the one serving are removed. An image still used by a
draining container cannot go at once, so the following full passes try again.
Functions a previous process served whose folder is gone by the next full pass
were deleted while Relay was down: their images are retired then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import anyio
import structlog

from relay.application.ports import ImageBuilder
from relay.application.registry import FunctionRegistry
from relay.application.services import ServiceConverger
from relay.domain.names import function_name_problem

_log = structlog.get_logger(__name__)

# A superseded image still used by a draining container cannot go at once; the
# following full passes (every 30 s) try again this many times. The next start's
# sweep catches anything left after that.
RETIRE_RETRY_PASSES = 3


class ImageRetirement:
    """The reconciler's image cleanup: what to retire again, and the leftovers of
    a previous process. ``lock`` gives the function's reconcile lock, which every
    retirement runs under."""

    def __init__(
        self,
        *,
        registry: FunctionRegistry,
        builder: ImageBuilder,
        services: ServiceConverger | None,
        lock: Callable[[str], anyio.Lock],
    ) -> None:
        self._registry = registry
        self._builder = builder
        self._services = services
        self._lock = lock
        self.retrying: dict[str, int] = {}  # functions to retire again: name -> passes left
        self.leftovers: set[str] = set()  # functions of a previous process, maybe deleted

    def add_leftovers(self, names: Iterable[str]) -> None:
        """Functions a previous process served (from the state view). Those whose
        folder is gone by the next full pass get their images retired then: they
        were deleted while Relay was down, so no removal ever ran for them."""
        self.leftovers.update(names)

    async def retire_leftover(self, name: str) -> None:
        """A full pass found no folder for this leftover: retire its images."""
        if function_name_problem(name) is None:
            async with self._lock(name):
                _log.info("function_leftover_retired", function=name)
                await self.retire(name)

    async def retry(self, name: str) -> None:
        """One of the full passes that try a retirement again."""
        async with self._lock(name):
            if name in self.retrying:
                await self.retire(name, retry=True)

    async def retire(self, name: str, *, retry: bool = False) -> None:
        """Remove the function's images other than the one serving (call under the
        function's lock, so ``keep`` is never stale). Images still used by draining
        containers survive; the next few full passes try again (a fresh swap or
        removal restarts that count; ``retry`` marks one of those passes)."""
        current = self._registry.get(name)
        keep = {current.image} if current is not None and current.image else set()
        if self._services is not None:
            keep |= self._services.images_in_use(name)
        try:
            await self._builder.retire(name, keep)
        except Exception as exc:  # noqa: BLE001 - cleanup is best effort, retried later
            _log.warning("function_retire_failed", function=name, error=str(exc))
        passes = self.retrying.get(name, 1) - 1 if retry else RETIRE_RETRY_PASSES
        if passes > 0:
            self.retrying[name] = passes
        else:
            self.retrying.pop(name, None)
