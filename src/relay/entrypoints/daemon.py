"""``relay start``: the long-running worker process.

Order matters and is written down here once:

1. configuration (exit 1 with one line per invalid variable), then something to
   serve (a readable functions directory or a git source, else exit 1 with one
   line: :mod:`relay.entrypoints.serving`), and logging;
2. the process lock under the run directory (a second worker fails here, before
   it can touch the first one's socket);
3. the composition root builds everything: Redis and the consumer group, Docker,
   the ``NETWORKS`` check, the orphan sweep, then the adapters;
4. the first reconcile of the functions directory, then the background loops,
   each started with ``task_status`` so the worker is "ready" only when all are;
5. the first SIGINT/SIGTERM stops reading and reclaiming at once and lets the
   invocations in flight finish within ``SHUTDOWN_GRACE`` (30 s by default; a
   second signal ends the grace at once), then cancels the loops: what was still
   running releases its claims uncharged (:mod:`relay.application.shutdown`);
   cleanup (containers, final stats flush, sockets, Redis last) runs shielded
   within a bounded budget.
"""

from __future__ import annotations

import gc
import importlib.util
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import anyio
import structlog

from relay.adapters.linewriter import writer_for
from relay.bootstrap import Worker, build_worker
from relay.domain.errors import ConfigError, RelayError
from relay.entrypoints.config import Settings, load_settings
from relay.entrypoints.logging import configure_logging
from relay.entrypoints.serving import require_something_to_serve
from relay.entrypoints.supervisor import follow_supervisor, supervise

log = structlog.get_logger("relay.daemon")

EXIT_OK = 0
EXIT_FAILURE = 1


def main(env: Mapping[str, str], functions_dir: Path, *, processes: int = 1) -> int:
    """Run the worker (or, with ``processes`` > 1, supervise that many) until
    signalled; return the process exit code."""
    follow_supervisor(env)
    try:
        settings = load_settings(env)
        require_something_to_serve(functions_dir, settings.paths.state_dir)
    except ConfigError as exc:
        for line in str(exc).splitlines():
            sys.stderr.write(f"relay: {line}\n")
        return EXIT_FAILURE
    configure_logging(settings.log_level, log_format=settings.log_format)
    if processes > 1:
        try:
            return supervise(env, settings, functions_dir, processes)
        except RelayError as exc:
            _say(f"relay: {exc}")
            return EXIT_FAILURE
    try:
        anyio.run(run, settings, functions_dir, backend_options=loop_options())
    except RelayError as exc:
        log.error("startup_failed", error=str(exc))  # noqa: TRY400 - a RelayError is one line, no traceback
        _say(f"relay: {exc}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _say(line: str) -> None:
    """The last word on stderr, after the log lines queued before it (the logs go
    through a writer thread: a direct write would overtake them)."""
    writer = writer_for(sys.stderr, "stderr")
    if writer is None:
        sys.stderr.write(line + "\n")
    else:
        writer.line(line)


def loop_options() -> dict[str, bool]:
    """uvloop when it is installed: about 8% less worker CPU per handled event
    (bench/profile_worker.py, side by side); the stdlib loop otherwise."""
    if importlib.util.find_spec("uvloop") is None:
        return {}
    return {"use_uvloop": True}


async def run(settings: Settings, functions_dir: Path) -> None:
    """Build the worker, start its loops, and wait for a signal."""
    log.info("relay_starting", functions=str(functions_dir), stream=settings.redis.stream,
             group=settings.redis.group, consumer=settings.hostname)
    async with build_worker(settings, functions_dir) as worker, anyio.create_task_group() as tg:
        if settings.observe.console.enabled:  # aiohttp's server and Jinja2 only then
            from relay.entrypoints.console.server import add_console  # noqa: PLC0415

            await add_console(worker, settings)
        tg.start_soon(_stop_on_signal, tg.cancel_scope, worker)
        await worker.start(tg)
        # What start-up built (modules, clients, the catalog) lives as long as the
        # process: freezing it keeps it out of every later collection, so a full
        # collection scans only what was allocated since, not the whole heap (a
        # 50 ms pause was seen mid-burst in bench/throughput.py's latency phase).
        gc.collect()
        gc.freeze()
        log.info("relay_started", functions=len(worker.registry.current().functions))
    log.info("relay_stopped")


async def _stop_on_signal(scope: anyio.CancelScope, worker: Worker) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("relay_stopping", signal=signal.Signals(signum).name)
            break
        hurry = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_hurry_on_signal, signals, hurry)
            await worker.drain(hurry)
            tg.cancel_scope.cancel()
        scope.cancel()


async def _hurry_on_signal(signals: AsyncIterator[int], hurry: anyio.Event) -> None:
    """A second signal during the grace: cancel what is in flight at once."""
    async for signum in signals:
        log.info("relay_stopping_now", signal=signal.Signals(signum).name)
        hurry.set()
        return
