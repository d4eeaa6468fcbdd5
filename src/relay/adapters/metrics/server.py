"""``GET /metrics`` on ``METRICS_ADDR`` and the 15-second backlog sampler.

The HTTP server is prometheus_client's own WSGI server in a daemon thread; it
only reads the registry, so a slow or failing scrape can never stop event
consumption. A bind failure (say, a taken port) is logged and retried every few
seconds; it is never fatal.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import anyio
import structlog
from anyio.abc import TaskStatus
from prometheus_client import start_http_server

from relay.adapters.metrics.registry import Metrics
from relay.domain.errors import ConfigError

_log = structlog.get_logger(__name__)

BACKLOG_INTERVAL_S = 15.0
BIND_RETRY_S = 5.0

class Backlog(NamedTuple):
    """What a backlog sample reads from the broker."""

    pending: int  # entries delivered or ready and not acknowledged
    oldest_age_s: float  # the oldest of them
    delayed: int = 0  # delayed events not due yet (issue 33)


BacklogReader = Callable[[], Awaitable[Backlog]]


def parse_listen_addr(addr: str) -> tuple[str, int]:
    """``:9090``, ``0.0.0.0:9090``, ``localhost:9090`` or ``[::1]:9090`` -> (host, port)."""
    host, sep, port_text = addr.strip().rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"invalid listen address {addr!r}: expected host:port or :port")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - ":port" means every interface
    return host, int(port_text)


class MetricsServer:
    """Serves the registry over HTTP for as long as :meth:`run` runs."""

    def __init__(self, metrics: Metrics, addr: str, *, retry_s: float = BIND_RETRY_S) -> None:
        self._metrics = metrics
        self.host, self.port = parse_listen_addr(addr)
        self._retry_s = retry_s
        self.bound_port: int | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Report started at once (binding is retried in the background), serve until
        cancelled, then shut the HTTP server down."""
        task_status.started()
        while True:
            try:
                server, thread = await anyio.to_thread.run_sync(self._start)
                break
            except OSError as exc:
                _log.warning(
                    "metrics_bind_failed", host=self.host, port=self.port,
                    error=str(exc), retry_in_s=self._retry_s,
                )
                await anyio.sleep(self._retry_s)
        self.bound_port = int(server.server_port)
        _log.info("metrics_server_started", host=self.host, port=self.bound_port)
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_stop, server, thread)
            _log.info("metrics_server_stopped")

    def _start(self) -> tuple[Any, threading.Thread]:
        return start_http_server(self.port, addr=self.host, registry=self._metrics.registry)


def _stop(server: Any, thread: threading.Thread) -> None:
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


async def sample_backlog(
    read: BacklogReader,
    metrics: Metrics,
    *,
    interval_s: float = BACKLOG_INTERVAL_S,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Set the backlog gauges from ``read`` now and every ``interval_s``; a failed
    read is logged and the gauges keep their last value."""
    task_status.started()
    failing = False
    while True:
        try:
            backlog = await read()
        except Exception as exc:  # noqa: BLE001 - sampling must never stop the worker
            if not failing:
                _log.warning("backlog_sample_failed", error=str(exc))
            failing = True
        else:
            if failing:
                _log.info("backlog_sample_recovered")
            failing = False
            metrics.set_backlog(*backlog)
        await anyio.sleep(interval_s)
