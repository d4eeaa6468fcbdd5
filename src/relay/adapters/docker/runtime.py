"""``DockerContainerRuntime``: warm, hardened execution containers per function.

Use it as an async context manager (``async with runtime:``): that runs the
housekeeping task (idle eviction, removal of containers discarded outside an
invocation). Pool events (``ContainerAcquired``, ``ContainerDiscarded``,
``ContainerWaited`` from ``relay.domain.events``) go to ``observer``, a sync
callable called at once, in order (the worker passes ``MessageBus.notify``).
An awaited publish per invocation cost a cancel scope and a bus pass per
handled event when events come one at a time; batching them held metrics back.
Live gauges come from :meth:`snapshot`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

import aiodocker
import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup

from relay.adapters.docker.attach import DeadlinePassed
from relay.adapters.docker.containers import (
    GRACE_S,
    ContainerSpec,
    ExecutionContainer,
    ProcessExited,
    start_container,
)
from relay.adapters.docker.direct import DirectSockets
from relay.adapters.docker.lines import ProtocolError
from relay.adapters.docker.networks import sweep_orphans, verify_networks
from relay.adapters.docker.pool import FunctionPool, Observer, PooledContainer
from relay.adapters.linewriter import writer_for
from relay.application.ports import StartGuard
from relay.domain.execution import (
    DISCARD_EVICTED,
    DISCARD_PROCESS_EXIT,
    DISCARD_PROTOCOL_ERROR,
    DISCARD_SHUTDOWN,
    DISCARD_TIMEOUT,
    CapturedOutput,
    InvocationRequest,
    InvocationResult,
    PoolSnapshot,
    RuntimeUnavailable,
    clamp_timeout_ns,
    failure_message,
)
from relay.domain.messages import DomainEvent

log = structlog.get_logger(__name__)

# A container that cannot be created, attached and started in this long is
# treated as an engine failure (the handler never ran).
START_TIMEOUT_S = 60.0


def _stdout_line(line: str) -> None:
    """The default output: stdout's bounded writer (see ``relay.adapters.linewriter``)."""
    writer = writer_for(sys.stdout, "stdout")
    if writer is None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    else:
        writer.line(line)


def _ignore(_: DomainEvent) -> None:
    return None


class _Ran(NamedTuple):
    ok: bool
    error: str
    reason: str | None
    exit_code: int | None = None
    result: str | None = None
    result_size: int = 0


class DockerContainerRuntime:
    """The ``ContainerRuntime`` port on a Docker engine."""

    def __init__(
        self,
        docker: aiodocker.Docker,
        *,
        hostname: str,
        networks: Sequence[str] = (),
        idle_timeout_s: float = 300.0,
        output: Callable[[str], None] | None = None,
        observer: Observer | None = None,
        max_containers: int | None = None,
        direct_dir: Path | None = None,
        handler_env: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self._docker = docker
        # the worker's own variables for every handler (RELAY_INGEST_URL and its
        # token): per request, never in the container's environment (docker inspect)
        self._handler_env = handler_env
        # Relay's own socket per container, under this directory (see
        # ``relay.adapters.docker.direct``); None: requests use the attach stream
        self.direct = DirectSockets(direct_dir) if direct_dir is not None else None
        self._hostname = hostname
        self._networks = tuple(networks)
        self._idle_timeout_s = idle_timeout_s
        self._sweep_interval = min(max(idle_timeout_s / 4, 0.05), 5.0)
        self._output = output or _stdout_line
        self._observer = observer or _ignore
        # worker-global bound on execution containers (set it >= MAX_CONCURRENCY:
        # then an idle one can always be retired when the bound is reached)
        self._max_containers = max_containers
        self._pools: dict[str, FunctionPool] = {}
        self._pending: list[ExecutionContainer] = []  # discarded, still to remove
        self._wake_housekeeping = anyio.Event()
        self._task_group: TaskGroup | None = None
        self._closed = False

    # --- lifecycle --------------------------------------------------------------------
    async def __aenter__(self) -> DockerContainerRuntime:
        self._task_group = anyio.create_task_group()
        await self._task_group.__aenter__()
        self._task_group.start_soon(self._housekeeping)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        assert self._task_group is not None
        self._task_group.cancel_scope.cancel()
        return await self._task_group.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        """Discard every idle container now (reason ``shutdown``); busy ones are
        discarded when their invocation ends."""
        self._closed = True
        for pool in self._pools.values():
            self._pending += pool.close()  # type: ignore[arg-type]
        await self._remove_pending()

    # --- the port -----------------------------------------------------------------------
    def activate(self, function: str, image: str, runtime: str, capacity: int) -> None:
        pool = self._pools.get(function)
        if pool is None:
            self._pools[function] = FunctionPool(
                function=function,
                image=image,
                runtime=runtime,
                capacity=max(1, capacity),
                observe=self._observer,
            )
            return
        self._dispose(pool.activate(image, runtime, capacity))

    def remove(self, function: str) -> None:
        pool = self._pools.get(function)
        if pool is None:
            return
        self._dispose(pool.remove())
        if pool.drained():
            del self._pools[function]

    def snapshot(self, function: str) -> PoolSnapshot | None:
        pool = self._pools.get(function)
        if pool is None or pool.removed:
            return None
        return pool.snapshot()

    def functions(self) -> list[str]:
        return sorted(name for name, pool in self._pools.items() if not pool.removed)

    async def invoke(
        self, request: InvocationRequest, *, guard: StartGuard | None = None
    ) -> InvocationResult:
        pool = self._pools.get(request.function)
        if pool is None or pool.removed or self._closed:
            raise RuntimeUnavailable(f'function "{request.function}" is not active')
        self._dispose(pool.evict_idle(self._idle_timeout_s, time.monotonic()))
        if self._task_group is None:
            await self._remove_pending()
        container = pool.lease_idle()  # the warm path, without awaiting the pool
        if not isinstance(container, ExecutionContainer) or container.exited():
            container = await self._lease_live(pool, container)
        if guard is not None:
            try:
                await guard()  # the claim must outlive the run (a slow start ate into it)
            except BaseException:
                reason = pool.release(container)
                if reason is not None:
                    await container.destroy()
                raise
        if self._handler_env is not None:
            request = msgspec.structs.replace(request, env={**request.env, **self._handler_env()})
        begun = time.monotonic()
        capture = CapturedOutput() if request.capture_output else None
        try:
            ran = await self._run(container, request, capture)
        except BaseException:
            # cancelled mid-request (shutdown): the container's state is unknown
            pool.discard_busy(container, DISCARD_SHUTDOWN)
            await container.destroy()
            raise
        duration = time.monotonic() - begun
        reason = ran.reason
        if reason is not None:
            pool.discard_busy(container, reason)
        else:
            reason = pool.release(container)
        if reason is not None:
            log.info(
                "container_discarded",
                function=request.function,
                container=container.id[:12],
                reason=reason,
            )
            await container.destroy()
        if pool.removed and pool.drained() and self._pools.get(request.function) is pool:
            del self._pools[request.function]
        return InvocationResult(
            ok=ran.ok,
            error="" if ran.ok else failure_message(request.function, request.handler, ran.error),
            exit_code=ran.exit_code,
            duration_s=duration,
            discarded=reason,
            result=ran.result,
            result_size=ran.result_size,
            output=tuple(capture.lines) if capture is not None else (),
            output_dropped=capture.dropped if capture is not None else 0,
            image=container.image,
        )

    async def _run(
        self,
        container: ExecutionContainer,
        request: InvocationRequest,
        capture: CapturedOutput | None,
    ) -> _Ran:
        """One request on a leased container; ``reason`` set when it must be discarded."""
        timeout_s = clamp_timeout_ns(request.timeout_ns) / 1e9
        try:
            # the container keeps the deadline (one timer, no cancel scope per call)
            answer = await container.call(request, timeout_s, self._output, capture)
        except DeadlinePassed:
            return _Ran(False, f"timed out after {timeout_s:g}s", DISCARD_TIMEOUT)
        except ProcessExited:
            code = await container.exit_code()
            detail = "the container's process exited"
            detail += f" with code {code}" if code is not None else ""
            return _Ran(False, detail, DISCARD_PROCESS_EXIT, code)
        except ProtocolError as exc:
            return _Ran(False, f"protocol error: {exc}", DISCARD_PROTOCOL_ERROR)
        except Exception as exc:  # noqa: BLE001 - the attachment broke in a way we did not foresee
            log.warning("container_stream_failed", function=request.function, error=repr(exc))
            return _Ran(False, f"lost the container's stream: {exc!r}", DISCARD_PROTOCOL_ERROR)
        if answer.result is None:
            return _Ran(answer.ok, answer.error, None)
        size = max(answer.result_size, len(answer.result))
        return _Ran(answer.ok, answer.error, None, result=answer.result, result_size=size)

    async def _lease_live(
        self, pool: FunctionPool, leased: PooledContainer | None = None
    ) -> ExecutionContainer:
        """A leased container whose process is alive (``leased``: one already taken)."""
        container = await self._lease(pool) if leased is None else leased
        assert isinstance(container, ExecutionContainer)
        while container.exited():
            # died while idle (killed, out of memory, its own deadline), or its
            # handler flooded Relay's socket after answering: not this event's
            # fault, so it never runs on it
            broken = container.link_broken() and not container.channel.closed
            pool.discard_busy(container, DISCARD_PROTOCOL_ERROR if broken else DISCARD_PROCESS_EXIT)
            await container.destroy()
            container = await self._lease(pool)
        return container

    # --- internals ------------------------------------------------------------------------
    async def _lease(self, pool: FunctionPool) -> ExecutionContainer:
        begun = time.monotonic()
        leased = await pool.lease()
        if leased is not None:
            assert isinstance(leased, ExecutionContainer)
            return leased
        await self._make_room()
        spec = ContainerSpec(
            function=pool.function,
            image=pool.image,
            runtime=pool.runtime,
            hostname=self._hostname,
            networks=self._networks,
            # past Relay's own eviction (lazy at lease, or the next housekeeping
            # pass), so the container never leaves first while Relay is alive
            idle_deadline_s=self._idle_timeout_s + self._sweep_interval + 2 * GRACE_S,
        )
        try:
            with anyio.fail_after(START_TIMEOUT_S):
                container = await start_container(self._docker, spec, self.direct)
        except Exception as exc:
            pool.start_failed()
            detail = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            raise RuntimeUnavailable(
                f'function "{pool.function}": could not start a container from '
                f"{pool.image}: {detail}"
            ) from exc
        except BaseException:
            pool.start_failed()
            raise
        pool.started(container, begun)
        log.debug("container_started", function=pool.function, container=container.id[:12])
        return container

    async def _make_room(self) -> None:
        """Over the global bound: retire the least recently used idle container."""
        if self._max_containers is None:
            return
        total = sum(len(p.idle) + len(p.busy) + p.starting for p in self._pools.values())
        if total <= self._max_containers:
            return
        candidates = [(c.last_used, p, c) for p in self._pools.values() for c in p.idle]
        if not candidates:
            log.warning("container_bound_exceeded", total=total, bound=self._max_containers)
            return
        _, owner, oldest = min(candidates, key=lambda item: item[0])
        owner.take_idle(oldest, DISCARD_EVICTED)
        assert isinstance(oldest, ExecutionContainer)
        await oldest.destroy()

    def _dispose(self, containers: Sequence[Any]) -> None:
        if containers:
            self._pending.extend(containers)
            self._wake_housekeeping.set()

    async def _remove_pending(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            async with anyio.create_task_group() as group:
                for container in batch:
                    group.start_soon(container.destroy)

    async def _housekeeping(self) -> None:
        while True:
            with anyio.move_on_after(self._sweep_interval):
                await self._wake_housekeeping.wait()
            self._wake_housekeeping = anyio.Event()
            now = time.monotonic()
            for name, pool in list(self._pools.items()):
                self._pending += pool.evict_idle(self._idle_timeout_s, now)  # type: ignore[arg-type]
                if pool.removed and pool.drained():
                    self._pools.pop(name, None)
            await self._remove_pending()


__all__ = ["DockerContainerRuntime", "sweep_orphans", "verify_networks"]
