"""Reconciling functions: from a directory on disk to a version that serves.

One reconcile of one function is: validate the name, load the template, prepare
the image (reused when its fingerprint already has one, else built), and ONLY
THEN swap it in: resize the function's concurrency slots, activate the image in
the container runtime, publish the new catalog, and retire superseded images.
Anything failing before the swap leaves the previous version serving and is
recorded as ``FunctionReconcileFailed``. A directory whose ``template.yaml`` is
momentarily missing (an editor's save, a git checkout) keeps its version; a
directory that is gone removes the function, letting in-flight work finish.
Superseded images are retired by :mod:`relay.application.image_retirement`;
what the state view records of a template is built by
:mod:`relay.application.function_summary`.

Reconciles of one function are serialised; different functions proceed in
parallel (image builds are bounded by the builder itself). Events are published
as they happen rather than at the end of a command, because a full pass can take
minutes and operators should see each function become pending, then ready.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import structlog

from relay.application.bus import Emit, Handler, Outcome, Send
from relay.application.function_summary import summarize
from relay.application.image_retirement import ImageRetirement
from relay.application.ports import (
    Clock,
    ContainerRuntime,
    FunctionBreakers,
    FunctionSlots,
    FunctionSource,
    ImageBuilder,
)
from relay.application.registry import ActiveFunction, FunctionRegistry
from relay.application.services import ServiceConverger
from relay.domain.commands import ConvergeServices, ReconcileAll, ReconcileFunction
from relay.domain.errors import RelayError, TemplateError
from relay.domain.events import (
    FunctionDiscovered,
    FunctionPrepared,
    FunctionReconcileFailed,
    FunctionRemoved,
    FunctionSkipped,
)
from relay.domain.functions import FunctionImage
from relay.domain.messages import Command
from relay.domain.names import function_name_problem
from relay.domain.template import Template

_log = structlog.get_logger(__name__)


# What one reconcile of one function did (the commands' results).
PREPARED = "prepared"  # a new version now serves
UNCHANGED = "unchanged"  # the serving version already matches the source
FAILED = "failed"  # template or build failed; the previous version (if any) serves
WAITING = "waiting"  # template.yaml missing: keep what serves, wait for more changes
SKIPPED = "skipped"  # not a function (invalid name, or no template and never served)
REMOVED = "removed"


class Reconciler:
    """The use cases behind ``ReconcileFunction`` and ``ReconcileAll`` (the
    commands of "function prepared" and "function removed"); services converge
    through the ``ConvergeServices`` command it sends; see the module docstring."""

    def __init__(
        self,
        *,
        registry: FunctionRegistry,
        source: FunctionSource,
        builder: ImageBuilder,
        runtime: ContainerRuntime,
        slots: FunctionSlots,
        clock: Clock,
        emit: Emit,
        send: Send,
        services: ServiceConverger | None = None,
        breakers: FunctionBreakers | None = None,
    ) -> None:
        self.registry = registry
        self._source = source
        self._builder = builder
        self._runtime = runtime
        self._slots = slots
        self._breakers = breakers
        self._clock = clock
        self._emit = emit
        self._send = send
        self._locks: dict[str, anyio.Lock] = {}
        self._failures: dict[str, str] = {}  # last recorded failure, per function
        self._skipped: dict[str, str] = {}  # invalid names already reported
        self._services = services
        self._images = ImageRetirement(
            registry=registry, builder=builder, services=services, lock=self._lock
        )

    def handlers(self) -> Mapping[type[Command], Handler]:
        """This use case's rows of the bus's handler table."""

        async def one(cmd: ReconcileFunction) -> Outcome[str]:
            return Outcome(await self.reconcile_function(cmd.name))

        async def every(_cmd: ReconcileAll) -> Outcome[dict[str, str]]:
            return Outcome(await self.reconcile_all())

        return {
            ReconcileFunction: one,
            ReconcileAll: every,
        }

    # --- whole directory --------------------------------------------------------
    async def reconcile_all(self) -> dict[str, str]:
        """Re-scan and reconcile every function in parallel; returns name -> result.

        When the functions directory itself cannot be read (a remount, a checkout
        swapping it), nothing is changed: an unreadable folder is not an empty one.
        """
        try:
            found = await anyio.to_thread.run_sync(self._source.scan)
        except OSError as exc:
            _log.warning("functions_dir_unreadable", error=str(exc))
            return {}
        present = {f.name for f in found}
        results: dict[str, str] = {}

        async def run(name: str, step: Callable[[], Awaitable[str]]) -> None:
            results[name] = await step()

        async with anyio.create_task_group() as tg:
            for entry in found:
                if entry.has_template or entry.name in self.registry.current().functions:
                    tg.start_soon(run, entry.name, _bind(self.prepare, entry.name, entry.directory))
            for name in self._known() - present:
                tg.start_soon(run, name, _bind(self.remove, name))
            for name in list(self._images.retrying):
                tg.start_soon(self._images.retry, name)
            for name in self._images.leftovers - present - set(self.registry.current().functions):
                tg.start_soon(self._images.retire_leftover, name)
        self._images.leftovers.clear()
        if self._services is not None:
            catalog = self.registry.current()
            known = set(catalog.functions) | set(catalog.unavailable) | set(self._failures)
            await self._services.sweep(known)
        # Recorded invocations of a function that is not loaded are released only
        # once the whole folder has been seen (see Catalog.complete).
        self.registry.mark_complete()
        return results

    async def reconcile_function(self, name: str) -> str:
        """Converge one function after a change under its directory."""
        directory = Path(self._source.directory_of(name))
        exists = await anyio.to_thread.run_sync(directory.is_dir)
        if not exists:
            if not await anyio.to_thread.run_sync(directory.parent.is_dir):
                _log.warning("functions_dir_unreadable", path=str(directory.parent))
                return WAITING  # the whole folder is gone: never remove what serves
            return await self.remove(name)
        return await self.prepare(name, str(directory))

    # --- one function -------------------------------------------------------------
    async def prepare(self, name: str, directory: str) -> str:
        problem = function_name_problem(name)
        if problem is not None:
            return await self._skip(name, f"invalid function name: {problem}")
        async with self._lock(name):
            try:
                template = await anyio.to_thread.run_sync(self._source.load_template, directory)
            except TemplateError as exc:
                self.registry.mark_unavailable(name)
                return await self._failed(name, f"invalid template: {exc}", None)
            if template is None:
                return self._waiting(name)
            await self._note_pending(name, directory, template)
            try:
                if template.runtime is None and self._services is not None:
                    image = await self._services.source_version(name, Path(directory))
                else:
                    image = await self._builder.prepare(name, Path(directory), template)
            except Exception as exc:  # noqa: BLE001 - one function never stops the others
                if not isinstance(exc, RelayError):
                    _log.exception("function_prepare_crashed", function=name)
                result = await self._failed(name, str(exc), template)
                await self._converge_services(name)  # the serving version heals its crashes
                return result
            result = await self._swap(name, directory, template, image)
            outcome = await self._converge_services(name, result)
            if result == PREPARED:
                await self._images.retire(name)  # after the services moved to the new image
            return outcome or result

    async def remove(self, name: str) -> str:
        async with self._lock(name):
            known = name in self._known()
            self._failures.pop(name, None)
            self._skipped.pop(name, None)
            loaded = name in self.registry.current().functions
            self.registry.drop(name)  # and no longer unavailable: it is gone
            if loaded:
                self._runtime.remove(name)
                self._slots.forget(name)
                if self._breakers is not None:  # added again, it starts closed
                    self._breakers.forget(name)
            if self._services is not None:
                await self._services.remove_function(name)
            if not known:
                return SKIPPED
            _log.info("function_removed", function=name)
            self._emit(FunctionRemoved(name=name, at=self._clock.now()))
            await self._images.retire(name)
            return REMOVED

    # --- steps ----------------------------------------------------------------------
    async def _swap(
        self, name: str, directory: str, template: Template, image: FunctionImage
    ) -> str:
        current = self.registry.get(name)
        if (
            current is not None
            and current.fingerprint == image.fingerprint
            and current.image == image.image
            and name not in self._failures
        ):
            return UNCHANGED
        at = now = self._clock.now()
        if current is not None and current.fingerprint == image.fingerprint:
            now = current.prepared_at or now  # the same version again (after a failure)
        capacity = self._slots.effective(template.concurrency)
        self._slots.resize(name, template.concurrency)
        if template.runtime is not None:
            self._runtime.activate(name, image.image, template.runtime, capacity)
        self.registry.put(
            ActiveFunction(
                name=name,
                directory=directory,
                template=template,
                runtime=template.runtime,
                image=image.image,
                fingerprint=image.fingerprint,
                prepared_at=now,
            )
        )
        self._failures.pop(name, None)
        _log.info(
            "function_prepared",
            function=name,
            image=image.image,
            built=image.built,
            capacity=capacity,
        )
        self._emit(
            FunctionPrepared(
                name=name,
                directory=directory,
                runtime=template.runtime,
                image=image.image,
                fingerprint=image.fingerprint,
                dependency_image=image.dependency_image,
                built=image.built,
                prepared_at=now,
                summary=summarize(template),
                at=at,
            )
        )
        return PREPARED

    async def _note_pending(self, name: str, directory: str, template: Template) -> None:
        """A function without a serving version enters (or stays in) the catalog as
        pending, so its matched events wait instead of being acknowledged."""
        current = self.registry.get(name)
        if current is not None and current.ready:
            return
        self.registry.put(
            ActiveFunction(
                name=name,
                directory=directory,
                template=template,
                runtime=template.runtime,
                image=None,
                fingerprint=None,
                prepared_at=None,
                last_error=current.last_error if current is not None else None,
            )
        )
        if current is None:
            _log.info("function_discovered", function=name, directory=directory)
            self._emit(
                FunctionDiscovered(
                    name=name,
                    directory=directory,
                    summary=summarize(template),
                    at=self._clock.now(),
                )
            )

    async def _failed(self, name: str, error: str, template: Template | None) -> str:
        current = self.registry.get(name)
        if current is not None and not current.ready:
            self.registry.put(_with_error(current, error))
        if self._failures.get(name) == error:
            return FAILED  # the same failure again (periodic pass): nothing new to record
        self._failures[name] = error
        serving = current if current is not None and current.ready else None
        _log.warning(
            "function_reconcile_failed",
            function=name,
            error=error,
            serving=serving.image if serving else None,
        )
        shown = serving.template if serving else (current.template if current else template)
        self._emit(
            FunctionReconcileFailed(
                name=name,
                error=error,
                at=self._clock.now(),
                runtime=shown.runtime if shown else None,
                image=serving.image if serving else None,
                fingerprint=serving.fingerprint if serving else None,
                prepared_at=serving.prepared_at if serving else None,
                summary=summarize(shown) if shown else None,
            )
        )
        return FAILED

    def _waiting(self, name: str) -> str:
        if name in self.registry.current().functions:
            _log.info("function_template_missing", function=name)
            return WAITING
        return SKIPPED

    async def _skip(self, name: str, reason: str) -> str:
        if self._skipped.get(name) != reason:
            self._skipped[name] = reason
            _log.warning("function_skipped", function=name, reason=reason)
            self._emit(FunctionSkipped(name=name, reason=reason, at=self._clock.now()))
        return SKIPPED

    async def _converge_services(self, name: str, result: str | None = None) -> str | None:
        """Send ``ConvergeServices`` for the serving version; a service problem
        makes the reconcile ``FAILED`` (the version serves on). ``result`` None:
        the new version failed to build, the serving one heals its crashed
        replicas, and the build failure stays the function's last word."""
        current = self.registry.get(name)
        if self._services is None or current is None or not current.ready:
            return result
        command = ConvergeServices(
            function=name, fresh=result == PREPARED, healing=result is None
        )
        failed = await self._send(command)
        if result is None:
            return None
        return FAILED if failed and result in (PREPARED, UNCHANGED) else result

    def add_leftovers(self, names: Iterable[str]) -> None:
        """Functions a previous process served (from the state view); see
        :meth:`ImageRetirement.add_leftovers`."""
        self._images.add_leftovers(names)

    def _known(self) -> set[str]:
        """Functions this process has told observers about."""
        return set(self.registry.current().functions) | set(self._failures)

    def _lock(self, name: str) -> anyio.Lock:
        return self._locks.setdefault(name, anyio.Lock())


def _with_error(function: ActiveFunction, error: str) -> ActiveFunction:
    fields: dict[str, Any] = {f: getattr(function, f) for f in function.__struct_fields__}
    fields["last_error"] = error
    return ActiveFunction(**fields)


def _bind(step: Callable[..., Awaitable[str]], *args: str) -> Callable[[], Awaitable[str]]:
    async def bound() -> str:
        return await step(*args)

    return bound
