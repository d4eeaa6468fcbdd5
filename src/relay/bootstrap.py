"""The worker's composition root.

:func:`relay.application.composition.compose` wires use cases to ports on one
command bus (and is what unit tests call with in-memory fakes).
:func:`build_worker` constructs the real adapters
(Redis, Docker, SQLite, the control socket) in dependency order inside an async
context manager, so every resource is closed in reverse order, shielded, when the
worker stops. Nothing here runs at import time, and nothing here reads the
environment: settings arrive already validated.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import TaskGroup

from relay.adapters.brokers import Broker, open_broker
from relay.adapters.control.lock import ProcessLock
from relay.adapters.control.server import ControlServer
from relay.adapters.docker.connection import connect_docker, engine_is_local
from relay.adapters.docker.images import DockerImageBuilder
from relay.adapters.docker.networks import sweep_orphans, verify_networks
from relay.adapters.docker.runtime import DockerContainerRuntime
from relay.adapters.docker.services import DockerServiceContainers, DockerServiceImages
from relay.adapters.fs.discovery import FsFunctionSource
from relay.adapters.fs.env_key import load_env_key
from relay.adapters.fs.functions_dir import nothing_to_serve
from relay.adapters.fs.secrets import FileSecretStore
from relay.adapters.fs.watcher import FunctionsWatcher
from relay.adapters.git.sync import worker_syncer
from relay.adapters.git.webhook import git_webhook
from relay.adapters.ingest.server import IngestServer
from relay.adapters.ingest.tokens import IngestTokens
from relay.adapters.linewriter import DroppedLines, writer_for
from relay.adapters.metrics.breakers import subscribe_breakers
from relay.adapters.metrics.ingest import subscribe_ingest
from relay.adapters.metrics.registry import Metrics
from relay.adapters.metrics.server import MetricsServer, sample_backlog
from relay.adapters.metrics.subscribers import InstrumentedImageBuilder, subscribe
from relay.adapters.otel.setup import open_tracing
from relay.adapters.sqlite.db import open_db, process_stats_path
from relay.adapters.sqlite.run_history import RunHistory, RunHistorySettings
from relay.adapters.sqlite.state_view import SqliteStateView
from relay.adapters.sqlite.stats_store import SqliteStatsStore
from relay.adapters.system import RandomTokenSource, SystemClock
from relay.application.buffer import MessageBuffer
from relay.application.bus import MessageBus
from relay.application.composition import Composition, compose
from relay.application.concurrency import Slots
from relay.application.consumer import ConsumerLoop, RecoveryLoop
from relay.application.registry import FunctionRegistry
from relay.application.scheduler import Scheduler
from relay.application.services import ServiceConverger
from relay.application.shutdown import COMPLETE, GracefulStop
from relay.application.stats import StatsRecorder
from relay.domain import commands as cmd
from relay.domain.execution import PoolSnapshot
from relay.domain.handler_context import ingest_env
from relay.domain.services import RoutingSettings

log = structlog.get_logger("relay.bootstrap")


def _direct_dir(docker: Any, wanted: Path, *, shared: bool = False) -> Path | None:
    """Where the containers' sockets go (``wanted``), or None (said once) when
    the engine is not on this host and could not mount them. ``shared``: the
    operator says the engine sees ``wanted`` at the same path (RELAY_DIRECT_DIR);
    the first container still proves it, else the short way turns itself off."""
    if shared or engine_is_local(docker):
        return wanted
    log.warning(
        "direct_socket_off",
        reason=f"the engine is reached at {docker.docker_host}, not through a local Unix socket",
        requests_go="through the engine's attach stream",
    )
    return None


# A background loop: ``async def run(*, task_status)`` started with ``TaskGroup.start``.
Loop = Callable[..., Coroutine[Any, Any, None]]

CLEANUP_BUDGET_S = 20.0


@dataclass
class WorkerParts:
    """The adapters an entrypoint beside the loops needs (the web console)."""

    broker: Broker
    history: RunHistory
    secrets: FileSecretStore
    settings: Any
    pools: Callable[[], dict[str, PoolSnapshot]] = dict
    """Each function's warm pool now (the console's functions page)."""


@dataclass
class Worker:
    """A composed worker and the background loops ``relay start`` runs."""

    composition: Composition
    loops: list[tuple[str, Loop]] = field(default_factory=list)
    before_start: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    stop: GracefulStop | None = None
    parts: WorkerParts | None = None
    """What the web console reads (set by :func:`build_worker`)."""

    async def drain(self, hurry: anyio.Event | None = None) -> str:
        """Stop taking messages and let those in flight finish within the grace
        (see :mod:`relay.application.shutdown`); the caller cancels the rest."""
        if self.stop is None:
            return COMPLETE
        return await self.stop.drain(hurry)

    @property
    def bus(self) -> MessageBus:
        return self.composition.bus

    @property
    def registry(self) -> FunctionRegistry:
        return self.composition.registry

    async def start(self, tg: TaskGroup) -> None:
        """Reconcile the functions directory once, then start every loop."""
        for step in self.before_start:
            await step()
        await self.bus.send(cmd.ReconcileAll())
        for name, loop in self.loops:
            await tg.start(loop, name=name)
        self.composition.health.mark_started()


def _print_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _stdout_output(stack: AsyncExitStack) -> Callable[[str], None]:
    """Forwarded handler lines, through a bounded writer thread: a stdout nobody
    reads drops lines (counted, said in one line) instead of stalling the loop."""
    writer = writer_for(sys.stdout, "stdout")
    if writer is None:  # an in-memory stdout cannot block
        return _print_line
    stack.callback(writer.close)
    return writer.line


@asynccontextmanager
async def build_worker(
    settings: Any, functions_dir: Path, *, output: Callable[[str], None] | None = None
) -> AsyncIterator[Worker]:
    """Construct every real adapter in startup order; close them in reverse."""
    clock = SystemClock()
    paths = settings.paths
    async with AsyncExitStack() as stack:
        # 1. The process lock, before anything can disturb a running worker.
        lock = ProcessLock(paths.run_dir)
        stack.callback(lock.close)
        if output is None:  # closed after everything else: what is queued goes out
            output = _stdout_output(stack)
        # 2. The broker: Redis and the consumer group, or the embedded broker file.
        broker = await open_broker(stack, settings, clock)
        tracing = await open_tracing(stack, broker)  # None unless OTEL_* asks (docs/operations)
        # 3. Docker, the NETWORKS check, and the orphan sweep.
        docker = await connect_docker()
        stack.push_async_callback(_shielded(docker.close))
        await verify_networks(docker, settings.networks)
        swept = await sweep_orphans(docker, settings.hostname)
        log.info("orphan_sweep_done", removed=swept)
        # 4. Adapters.
        metrics = Metrics()
        metrics.registry.register(DroppedLines())
        bus = MessageBus({})
        secret_store = FileSecretStore(paths.secrets_dir)
        tokens = IngestTokens(secret_store, settings.ingest.token_secret)
        runtime = DockerContainerRuntime(
            docker,
            hostname=settings.hostname,
            networks=settings.networks,
            idle_timeout_s=settings.warm_idle_timeout_ns / 1e9,
            output=output,
            max_containers=settings.max_concurrency,
            observer=bus.emit,
            direct_dir=_direct_dir(
                docker, paths.direct_dir, shared=paths.shared_direct_dir is not None
            ),
            handler_env=_handler_env(settings, tokens),
        )
        builder = InstrumentedImageBuilder(DockerImageBuilder(docker), metrics)
        slots = Slots(settings.max_concurrency)
        stats = StatsRecorder(metrics, SqliteStatsStore(_stats_db(stack, settings)), clock)
        # Under `relay start --processes N` only the first process converges the
        # host's service containers (they are one set per host, not per process).
        services = None
        if settings.process == 0:
            services = _service_converger(docker, settings, secret_store, clock)
            # LIFO: runs before the engine connection closes (graceful shutdown only).
            stack.push_async_callback(_shielded(services.stop_all))
        composition = compose(
            bus=bus,
            registry=FunctionRegistry(),
            source=FsFunctionSource(functions_dir),
            builder=builder,
            runtime=runtime,
            slots=slots,
            secrets=secret_store,
            clock=clock,
            tokens=RandomTokenSource(),
            stream=broker.stream,
            ledger=broker.ledger,
            dead_letters=broker.dead_letters,
            stats=stats,
            max_event_bytes=settings.max_event_bytes,
            history=broker.history,
            services=services,
            dispatch_runtime=None if tracing is None else tracing.invoker(runtime),
            publisher=broker.publisher,
            git=worker_syncer(paths.state_dir, functions_dir),
        )
        _observe(bus, metrics, tracing, lambda: _pool_snapshots(runtime))
        state_view = SqliteStateView(paths.database)
        # Functions the previous process served: those deleted while Relay was down
        # get their images retired by the first full pass.
        composition.reconciler.add_leftovers(await state_view.open())
        stack.push_async_callback(_shielded(state_view.aclose))
        # LIFO: once every loop stopped, what they emitted last reaches the state view
        stack.push_async_callback(_shielded(bus.drain))
        state_view.subscribe(bus)
        history = _run_history(bus, paths.database, settings)
        # bound before the runtime's task group: a taken port fails start-up in one line
        webhook_loops = await _git_webhook(stack, settings, functions_dir, bus)
        webhook_loops += await _ingest(stack, settings, broker, tokens, bus=bus, metrics=metrics)
        await stack.enter_async_context(runtime)  # containers are discarded on exit

        worker = Worker(composition)
        worker.before_start.append(stats.restore)
        _add_loops(
            worker,
            settings,
            functions_dir,
            lock=lock,
            broker=broker,
            metrics=metrics,
            slots=slots,
            stats=stats,
            clock=clock,
        )
        worker.loops += webhook_loops
        if history.settings.limit > 0:
            worker.loops.append(("run-history", history.run))
        worker.parts = WorkerParts(
            broker, history, secret_store, settings, lambda: _pool_snapshots(runtime)
        )
        yield worker


def _observe(
    bus: MessageBus,
    metrics: Metrics,
    tracing: Any,
    pools: Callable[[], dict[str, PoolSnapshot]],
) -> None:
    """The synchronous observers: traces (when on), metrics and the breaker gauges."""
    if tracing is not None:
        tracing.traces.subscribe(bus)
    subscribe(bus, metrics)
    subscribe_breakers(bus, metrics.registry)
    metrics.watch_pools(pools)


def _run_history(bus: MessageBus, database: Path, settings: Any) -> RunHistory:
    """The run history, subscribed unless ``RUN_HISTORY_LIMIT=0`` turns it off
    (then no subscriber and no writes: the console reads an empty history)."""
    history = RunHistory(database, _history_settings(settings))
    if history.settings.limit > 0:
        history.subscribe(bus)
    return history


def _history_settings(settings: Any) -> RunHistorySettings:
    observe = getattr(settings, "observe", None)
    if observe is None:
        return RunHistorySettings()
    values = observe.run_history
    return RunHistorySettings(
        limit=values.limit,
        retention_s=values.retention_ns / 1e9,
        rollup_retention_s=values.rollup_retention_ns / 1e9,
    )


def _stats_db(stack: AsyncExitStack, settings: Any) -> Any:
    """Where this process's stats rows live: the state database for a lone worker
    (and the first of ``--processes N``), else a file of its own that ``relay stats``
    adds up (a stats save replaces the rows: shared, the processes would overwrite
    each other's counts)."""
    if settings.process == 0:
        path = settings.paths.database
    else:
        path = process_stats_path(settings.paths.state_dir, settings.process)
    db = open_db(path)
    stack.callback(db.close)
    return db


def _service_converger(
    docker: Any, settings: Any, secrets: FileSecretStore, clock: SystemClock
) -> ServiceConverger:
    traefik = settings.traefik
    return ServiceConverger(
        images=DockerServiceImages(docker),
        containers=DockerServiceContainers(docker, hostname=settings.hostname),
        secrets=secrets,
        routing=RoutingSettings(
            network=traefik.network,
            entrypoints=tuple(traefik.entrypoints),
            certresolver=traefik.certresolver,
            priority=traefik.priority,
            host_override=traefik.host_override,
        ),
        hostname=settings.hostname,
        env_key=load_env_key(settings.paths.state_dir / "service-env.key"),
        clock=clock,
    )


def _add_loops(
    worker: Worker,
    settings: Any,
    functions_dir: Path,
    *,
    lock: ProcessLock,
    broker: Broker,
    metrics: Metrics,
    slots: Slots,
    stats: StatsRecorder,
    clock: SystemClock,
) -> None:
    """The background loops of ``relay start``, in the order they are started."""
    bus = worker.bus
    buffer = MessageBuffer(settings.max_buffered_events)
    metrics.watch_worker(
        in_flight=lambda: slots.in_flight,
        buffered=lambda: buffer.occupancy,
        concurrency_waits=lambda: slots.waits_total,
    )

    async def dispatch(messages: Sequence[Any], done: Callable[[str], None]) -> None:
        await bus.send(cmd.DispatchBatch(messages=tuple(messages), done=done))

    async def on_change(name: str) -> None:
        await bus.send(cmd.ReconcileFunction(name=name))

    async def on_full_pass() -> None:
        await bus.send(cmd.ReconcileAll())

    stream = broker.stream
    # A read is one batch: at most the slots that can run it, or half the buffer
    # when that is more (the loop reads again once half the buffer is free).
    read_max = max(settings.max_concurrency, settings.max_buffered_events // 2)
    consumer = ConsumerLoop(stream, dispatch, buffer, read_max=read_max)
    recovery = RecoveryLoop(
        stream,
        dispatch,
        buffer,
        emit=bus.emit,
        interval_s=settings.recovery.interval_s,
        min_idle_ms=settings.recovery.min_idle_ms,
    )
    worker.stop = GracefulStop(
        [consumer, recovery], buffer, grace_s=settings.shutdown_grace_ns / 1e9
    )
    # A broker outage shows in `relay health` while the loops keep retrying.
    worker.composition.health.watch(broker.name, lambda: consumer.health.healthy)
    worker.composition.health.watch(f"{broker.name} recovery", lambda: recovery.health.healthy)
    # Nothing to serve is not healthy (issue 35.2): a directory gone under the
    # worker, or not synced yet from its git source, holds every event it reads.
    worker.composition.health.explain("functions", lambda: nothing_to_serve(functions_dir))
    control = ControlServer(lock, bus.send)
    worker.loops += [
        ("events", bus.run),
        ("control", control.serve),
        ("stats", stats.run),
        ("watcher", FunctionsWatcher(functions_dir, on_change, on_full_pass).run),
        ("consumer", consumer.run),
        ("recovery", recovery.run),
        ("backlog", _bind(sample_backlog, broker.backlog, metrics)),
    ]
    if settings.metrics_addr is not None:
        server = MetricsServer(metrics, str(settings.metrics_addr))
        worker.loops.append(("metrics", server.run))
    worker.loops += broker.loops
    scheduler = Scheduler(registry=worker.registry, clock=clock, send=bus.send)
    worker.loops.append(("scheduler", scheduler.run))


async def _git_webhook(
    stack: AsyncExitStack, settings: Any, functions_dir: Path, bus: MessageBus
) -> list[tuple[str, Loop]]:
    """The GitHub webhook, opt-in twice: ``GIT_WEBHOOK_ADDR`` and a git source."""
    addr = settings.git_webhook_addr
    if addr is None:
        log.info("git_webhook_disabled", reason="GIT_WEBHOOK_ADDR is not set")
        return []
    wired = git_webhook(
        host=addr.host,
        port=addr.port,
        state_dir=settings.paths.state_dir,
        secrets=FileSecretStore(settings.paths.secrets_dir),
        send=bus.send,
        emit=bus.emit,
    )
    if wired is None:
        return []
    scheduler, server = wired
    await server.bind()
    stack.push_async_callback(server.aclose)
    return [("git-sync", scheduler.run), ("git-webhook", server.run)]


def _handler_env(
    settings: Any, tokens: IngestTokens
) -> Callable[[], dict[str, str]] | None:
    """``RELAY_INGEST_URL`` (and its token) for every handler, when configured."""
    url = settings.ingest.handler_url
    if url is None:
        return None
    return lambda: ingest_env(url, tokens.handler_env_token())


async def _ingest(
    stack: AsyncExitStack,
    settings: Any,
    broker: Broker,
    tokens: IngestTokens,
    *,
    bus: MessageBus,
    metrics: Metrics,
) -> list[tuple[str, Loop]]:
    """HTTP ingest, opt-in: ``INGEST_ADDR``; bound now, so a taken port or an
    unreadable token secret fails start-up in one line."""
    ingest = settings.ingest
    if ingest.addr is None:
        return []
    subscribe_ingest(bus, metrics.registry)
    server = IngestServer(
        ingest.addr.host,
        ingest.addr.port,
        publisher=broker.events,
        tokens=tokens,
        notify=bus.emit,
        max_event_bytes=settings.max_event_bytes,
        max_body_bytes=ingest.max_body_bytes,
        max_requests=ingest.max_requests,
    )
    await server.bind()
    stack.push_async_callback(server.aclose)
    return [("ingest", server.run)]


def _pool_snapshots(runtime: DockerContainerRuntime) -> dict[str, PoolSnapshot]:
    snapshots = {name: runtime.snapshot(name) for name in runtime.functions()}
    return {name: snap for name, snap in snapshots.items() if snap is not None}


def _shielded(close: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_BUDGET_S):
            await close()

    return run


def _bind(loop: Callable[..., Awaitable[None]], *args: Any) -> Loop:
    async def run(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        await loop(*args, task_status=task_status)

    return run
