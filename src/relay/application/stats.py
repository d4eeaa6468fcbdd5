"""Persisting operational stats: periodic flush, restore at start, worker-owned reset.

The metrics registry stays the single source of truth and stays monotonic for
the process lifetime. A reset records a baseline (the counters at that moment)
and persists ``current - baseline`` from then on. Flush and reset take the same
lock, so a snapshot captured before a reset can never be written after it.
"""

from __future__ import annotations

import anyio
import structlog
from anyio.abc import TaskStatus

from relay.application.ports import Clock, StatsSource, StatsStore
from relay.domain.stats import StatsSnapshot, since_baseline

_log = structlog.get_logger(__name__)

FLUSH_INTERVAL_S = 5.0
FINAL_FLUSH_BUDGET_S = 5.0


class StatsRecorder:
    """Flushes ``source`` into ``store`` every few seconds and once at shutdown."""

    def __init__(
        self,
        source: StatsSource,
        store: StatsStore,
        clock: Clock,
        *,
        interval_s: float = FLUSH_INTERVAL_S,
        final_budget_s: float = FINAL_FLUSH_BUDGET_S,
    ) -> None:
        self._source = source
        self._store = store
        self._clock = clock
        self._interval_s = interval_s
        self._final_budget_s = final_budget_s
        self._lock = anyio.Lock()
        self._baseline = StatsSnapshot()
        self._failing = False

    async def restore(self) -> None:
        """Start the live counters from the persisted totals (call once, before
        consumption starts). A broken store is logged; counting starts from zero."""
        try:
            persisted = await self._store.load()
        except Exception as exc:  # noqa: BLE001 - stats never stop the worker
            _log.warning("stats_restore_failed", error=str(exc))
            return
        self._source.restore(persisted)
        _log.debug("stats_restored", events_received=persisted.total("events_received"))

    async def flush(self) -> None:
        """Persist the counters accumulated since the last reset."""
        async with self._lock:
            snapshot = since_baseline(self._source.snapshot(), self._baseline)
            await self._store.save(snapshot, self._clock.now())

    async def reset(self) -> None:
        """Zero the persisted counters and continue from zero (Prometheus untouched)."""
        async with self._lock:
            self._baseline = self._source.snapshot()
            await self._store.reset(self._clock.now())
        _log.info("stats_reset")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Flush every interval until cancelled, then once more within a bounded budget."""
        task_status.started()
        try:
            while True:
                await anyio.sleep(self._interval_s)
                await self._flush_logged()
        finally:
            with anyio.move_on_after(self._final_budget_s, shield=True):
                await self._flush_logged()

    async def _flush_logged(self) -> None:
        try:
            await self.flush()
        except Exception as exc:  # noqa: BLE001 - state errors are logged, never fatal
            if not self._failing:
                _log.warning("stats_flush_failed", error=str(exc))
            self._failing = True
        else:
            if self._failing:
                _log.info("stats_flush_recovered")
            self._failing = False
