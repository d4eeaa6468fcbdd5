"""Converging a function's persistent services (the ``ConvergeService`` use case).

Called by the reconciler on every reconcile of a function, the periodic full
pass included, never from a loop of its own. For each service of the template:

1. resolve the desired image, the environment (secrets resolved now) and the
   routing network; any failure is reported and the service's existing
   containers are left exactly as they are (a transient outage never degrades a
   working service);
2. plan against the observed containers (:func:`relay.domain.services.plan_convergence`);
3. start missing slots, replace stale replicas start-before-stop (the old one is
   removed only once its replacement runs), remove crashed and excess ones.

Containers of services no longer declared, and of removed functions, are
removed. A crashed replica is recreated on the next pass: no restart loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import anyio
import structlog

from relay.application.environment import resolve_environment
from relay.application.ports import Clock, SecretStore, ServiceContainers, ServiceImages
from relay.application.registry import ActiveFunction
from relay.domain.errors import RelayError
from relay.domain.events import (
    FunctionPrepared,
    FunctionReconcileFailed,
    FunctionSummary,
    ReplicaState,
    ServicesConverged,
    ServiceState,
)
from relay.domain.functions import FunctionImage
from relay.domain.messages import DomainEvent
from relay.domain.services import (
    DesiredService,
    ObservedReplica,
    RoutingSettings,
    env_hash,
    is_stale,
    missing_network,
    plan_convergence,
    router_rule,
    routing_problem,
    service_environment,
)
from relay.domain.template import ServiceSpec, Template

_log = structlog.get_logger(__name__)

RUNNING, MISSING, REPLACING = "running", "missing", "replacing"


class ServiceConverger:
    """Keeps every declared service at its replica count; see the module docstring."""

    def __init__(
        self,
        *,
        images: ServiceImages,
        containers: ServiceContainers,
        secrets: SecretStore,
        routing: RoutingSettings,
        hostname: str,
        env_key: bytes,
        clock: Clock,
    ) -> None:
        self._images = images
        self._containers = containers
        self._secrets = secrets
        self._routing = routing
        self._hostname = hostname
        self._env_key = env_key
        self._clock = clock
        self._shown: dict[str, tuple[ServiceState, ...]] = {}
        self._images_in_use: dict[str, set[str]] = {}
        self._reported: dict[str, str] = {}  # the service problems last reported

    async def source_version(self, function: str, directory: Path) -> FunctionImage:
        """The version of a template with only ``build``/``image`` services."""
        return await self._images.source_version(function, directory)

    def images_in_use(self, function: str) -> set[str]:
        """Image references the function's replicas run (kept by image retirement)."""
        return set(self._images_in_use.get(function, ()))

    async def converge_version(
        self, current: ActiveFunction, summary: FunctionSummary, *, fresh: bool
    ) -> tuple[bool, list[DomainEvent]]:
        """Converge a serving version's services; whether a problem remains, and
        the events: ``ServicesConverged`` on a change, ``FunctionReconcileFailed``
        for a problem (once per text, again after a ``fresh`` version), and the
        version confirmed (``FunctionPrepared``) once the problems clear."""
        name = current.name
        problems, events = await self.converge(
            name, current.directory, current.template, current.image or None
        )
        at = self._clock.now()
        if problems:
            error = "; ".join(problems)
            if fresh or self._reported.get(name) != error:
                self._reported[name] = error
                events.append(_failed(current, summary, error, at))
            return True, events
        if self._reported.pop(name, None) is not None and not fresh:
            _log.info("function_services_recovered", function=name)
            events.append(_confirmed(current, summary, at))
        return False, events

    async def converge(
        self,
        function: str,
        directory: str,
        template: Template,
        function_image: str | None,
    ) -> tuple[list[str], list[DomainEvent]]:
        """One pass over the function's services: the problems (one line each,
        no secret value) and the events to publish (only on a change)."""
        observed = await self._containers.observe(function)
        declared = {s.identity for s in template.services}
        problems: list[str] = []
        states: list[ServiceState] = []
        images: set[str] = set()
        for replica in observed:
            if replica.labels.get("relay.identity") not in declared:
                await self._remove(function, replica.id, "service_removed")
        for service in template.services:
            mine = [r for r in observed if r.labels.get("relay.identity") == service.identity]
            images.update(r.labels.get("relay.image", "") for r in mine)
            state = await self._converge_one(
                function, Path(directory), template, service, function_image, mine
            )
            states.append(state)
            if state.error is not None:
                problems.append(state.error)
        self._images_in_use[function] = images | await self._running_images(function)
        return problems, self._changed(function, tuple(states))

    async def remove_function(self, function: str) -> list[DomainEvent]:
        """The function is gone: every one of its service containers goes."""
        for replica in await self._containers.observe(function):
            await self._remove(function, replica.id, "service_removed")
        self._images_in_use.pop(function, None)
        self._shown.pop(function, None)
        self._reported.pop(function, None)
        return []

    async def sweep(self, known: Iterable[str]) -> None:
        """Remove containers of functions this worker does not serve (left by a
        previous process for a function deleted meanwhile)."""
        keep = set(known)
        for replica in await self._containers.observe():
            owner = replica.labels.get("relay.function", "")
            if owner not in keep:
                await self._remove(owner, replica.id, "service_leftover_removed")

    async def stop_all(self) -> int:
        """Graceful shutdown: stop and remove every service container of this worker."""
        replicas = await self._containers.observe()
        # in parallel: each stop may take its grace, and shutdown has one budget
        # (what does not make it is swept by the next start's first pass)
        async with anyio.create_task_group() as tg:
            for replica in replicas:
                tg.start_soon(
                    self._remove, replica.labels.get("relay.function", ""), replica.id, ""
                )
        if replicas:
            _log.info("services_stopped", containers=len(replicas))
        return len(replicas)

    # --- one service --------------------------------------------------------------
    async def _converge_one(  # noqa: PLR0917 - one pass's context, read once
        self,
        function: str,
        directory: Path,
        template: Template,
        service: ServiceSpec,
        function_image: str | None,
        observed: list[ObservedReplica],
    ) -> ServiceState:
        try:
            desired = await self._desired(function, directory, template, service, function_image)
        except RelayError as exc:
            _log.warning(
                "service_unresolved", function=function, service=service.identity, error=str(exc)
            )
            return self._state(service, observed, None, error=str(exc))
        plan = plan_convergence(desired, observed)
        failures: list[str] = []
        for container_id in plan.remove:
            await self._remove(function, container_id, "service_replica_removed")
        for slot in plan.start:
            await self._start(desired, slot, failures)
        for slot, old in plan.replace:
            if await self._start(desired, slot, failures):
                await self._remove(function, old, "service_replica_replaced")
        if plan.changes:
            observed = await self._containers.observe(function)
            observed = [r for r in observed if r.labels.get("relay.identity") == service.identity]
        error = failures[0] if failures else None
        return self._state(service, observed, desired, error=error)

    async def _desired(
        self,
        function: str,
        directory: Path,
        template: Template,
        service: ServiceSpec,
        function_image: str | None,
    ) -> DesiredService:
        problem = routing_problem(service, self._routing)
        if problem is not None:
            raise RelayError(problem)
        network = self._routing.network
        if (
            service.host is not None
            and network
            and not await self._containers.network_exists(network)
        ):
            raise RelayError(missing_network(service, network))
        image = await self._images.resolve(
            function,
            directory,
            service,
            runtime=template.runtime,
            function_image=function_image,
        )
        try:
            secret_values = resolve_environment({}, template.secrets, self._secrets)
        except RelayError as exc:
            raise RelayError(f'service "{service.identity}": {exc}') from None
        env = service_environment(image.env, template.env, secret_values, service.port)
        return DesiredService(
            function=function,
            spec=service,
            image=image,
            env=env,
            env_hash=env_hash(env, self._env_key),
            routing=self._routing,
            hostname=self._hostname,
        )

    async def _start(self, desired: DesiredService, slot: int, failures: list[str]) -> bool:
        try:
            container_id = await self._containers.start(desired, slot)
        except RelayError as exc:
            failures.append(f'service "{desired.spec.identity}": {exc}')
            _log.warning(
                "service_replica_start_failed",
                function=desired.function,
                service=desired.spec.identity,
                replica=slot,
                error=str(exc),
            )
            return False
        _log.info(
            "service_replica_started",
            function=desired.function,
            service=desired.spec.identity,
            replica=slot,
            image=desired.image.image,
            container=container_id[:12],
        )
        return True

    async def _remove(self, function: str, container_id: str, event: str) -> None:
        try:
            await self._containers.remove(container_id)
        except RelayError as exc:
            _log.warning(
                "service_replica_remove_failed",
                function=function,
                container=container_id[:12],
                error=str(exc),
            )
            return
        if event:
            _log.info(event, function=function, container=container_id[:12])

    async def _running_images(self, function: str) -> set[str]:
        return {r.labels.get("relay.image", "") for r in await self._containers.observe(function)}

    # --- what inspect shows ---------------------------------------------------------
    def _state(
        self,
        service: ServiceSpec,
        observed: list[ObservedReplica],
        desired: DesiredService | None,
        *,
        error: str | None,
    ) -> ServiceState:
        replicas = []
        for slot in range(service.replicas):
            here = [r for r in observed if r.slot == slot and r.running]
            state = RUNNING
            if not here:
                state = MISSING
            elif desired is not None and all(is_stale(r, desired.labels(slot)) for r in here):
                state = REPLACING
            replicas.append(ReplicaState(slot=slot, state=state))
        rule = None
        if service.host is not None:
            rule = router_rule(service.host, service.path, self._routing.host_override)
        return ServiceState(
            identity=service.identity,
            display=service.display,
            replicas=tuple(replicas),
            rule=rule,
            error=error,
        )

    def _changed(self, function: str, states: tuple[ServiceState, ...]) -> list[DomainEvent]:
        if self._shown.get(function) == states:
            return []
        self._shown[function] = states
        return [ServicesConverged(name=function, services=states, at=self._clock.now())]


def _failed(
    current: ActiveFunction, summary: FunctionSummary, error: str, at: float
) -> FunctionReconcileFailed:
    return FunctionReconcileFailed(
        name=current.name,
        error=error,
        at=at,
        runtime=current.runtime,
        image=current.image,
        fingerprint=current.fingerprint,
        prepared_at=current.prepared_at,
        summary=summary,
    )


def _confirmed(current: ActiveFunction, summary: FunctionSummary, at: float) -> FunctionPrepared:
    """The serving version, confirmed again (its services converged after a failure)."""
    return FunctionPrepared(
        name=current.name,
        directory=current.directory,
        runtime=current.runtime,
        image=current.image or "",
        fingerprint=current.fingerprint or "",
        dependency_image=None,
        built=False,
        prepared_at=current.prepared_at or at,
        summary=summary,
        at=at,
    )
