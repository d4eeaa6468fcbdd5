"""Relay's Prometheus series, in a registry of their own (never the global one).

:class:`Metrics` is the live source of every operational number: the bus
subscribers in :mod:`relay.adapters.metrics.subscribers` feed it from domain
events, ``GET /metrics`` exposes it, and :meth:`Metrics.snapshot` reads the
cumulative counters the stats store persists (with the per-function ``Last*``
execution timestamps, which are kept here but are no Prometheus series). Labels
are bounded: function, handler, outcome, state and reason only; ids are never labels.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from relay.adapters.metrics.series import CounterSeries, HistogramSeries
from relay.domain.execution import ACQUIRE_COLD, ACQUIRE_WARM, PoolSnapshot
from relay.domain.stats import GLOBAL_COUNTERS, StatsSnapshot

OUTCOME_SUCCESS = "success"
OUTCOME_FAILURE = "failure"
NO_FUNCTION = "-"  # the DLQ placeholder of a malformed message: counted globally only

# per-function counter key -> metric name (without the ``_total`` suffix)
_FUNCTION_SERIES = {
    "events_matched": "function_events_matched",
    "handler_success": "function_handler_success",
    "handler_failure": "function_handler_failure",
    "retries": "function_retries",
    "dlq_entries": "function_dlq_entries",
}

PoolSource = Callable[[], Mapping[str, PoolSnapshot]]


class Metrics:
    """Every series the spec names, plus the reads the stats flush needs."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._clock = clock  # wall clock (epoch s) stamping the Last* timestamps
        self._lock = threading.Lock()  # guards tombstones, restored baselines, Last*
        self._last: dict[str, dict[str, float]] = {}  # function -> Last* key -> epoch s
        self._removed: set[str] = set()
        self._restored_discards: dict[str, int] = {}
        # The series a handled event updates are plain-dict series (see .series).
        self._globals = {
            key: CounterSeries(key, _HELP[key], registry=r) for key in GLOBAL_COUNTERS
        }
        self._per_function = {
            key: CounterSeries(name, f"Per function: {_HELP[key]}", ["function"], registry=r)
            for key, name in _FUNCTION_SERIES.items()
        }
        self.handler_invocations = CounterSeries(
            "handler_invocations", "Handler executions by outcome.",
            ["outcome", "function", "handler"], registry=r,
        )
        self.build_failures = Counter(
            "build_failures", "Failed function image builds.", ["function"], registry=r
        )
        self.handler_duration = HistogramSeries(
            "handler_duration_seconds", "Handler execution time.",
            ["function", "handler"], registry=r,
        )
        self.build_duration = Histogram(
            "function_build_seconds", "Function image preparation time.",
            ["function"], registry=r, buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1200),
        )
        self.pending_entries = Gauge(
            "pending_entries", "Entries pending in the consumer group (XPENDING).", registry=r
        )
        self.pending_oldest_age = Gauge(
            "pending_oldest_age_seconds", "Age of the oldest pending entry.", registry=r
        )
        self.delayed_entries = Gauge(
            "delayed_entries", "Delayed events not due yet (not in the stream or queue yet).",
            registry=r,
        )
        self.schedule_published = Counter(
            "schedule_occurrences_published", "Schedule occurrences this worker published.",
            registry=r,
        )
        self.schedule_duplicate = Counter(
            "schedule_occurrences_duplicate", "Occurrences another worker had already published.",
            registry=r,
        )
        self.schedule_failures = Counter(
            "schedule_publish_failures", "Occurrence publishes that failed.", registry=r
        )
        self.schedule_obsolete = Counter(
            "schedule_occurrences_obsolete", "Occurrences acknowledged unrun: schedule removed.",
            ["function", "handler"], registry=r,
        )
        self.schedule_skipped = Counter(
            "schedule_occurrences_skipped", "Occurrences acknowledged unrun: overlap: skip.",
            ["function", "handler"], registry=r,
        )
        self.schedule_caught_up = Counter(
            "schedule_occurrences_caught_up", "Missed occurrences published at start (catchup).",
            ["function", "handler"], registry=r,
        )
        self.acquires = CounterSeries(
            "runtime_container_acquires", "Container leases: warm (reused) or cold (started).",
            ["function", "outcome"], registry=r,
        )
        self.discards = Counter(
            "runtime_container_discards", "Containers torn down instead of pooled, by cause.",
            ["function", "reason"], registry=r,
        )
        self.acquire_duration = HistogramSeries(
            "runtime_container_acquire_duration_seconds",
            "Successful container acquires, end to end including any wait.",
            ["function"], registry=r,
        )
        self.container_waits = Counter(
            "runtime_container_waits", "Acquires that blocked at the pool bound.",
            ["function"], registry=r,
        )
        self.git_syncs = Counter(
            "git_syncs", "Git syncs this worker ran (webhook), by outcome.", ["outcome"],
            registry=r,
        )
        self.git_webhook_deliveries = Counter(
            "git_webhook_deliveries", "GitHub webhook deliveries answered, by outcome.",
            ["outcome"], registry=r,
        )
        self._pools = _PoolCollector()
        r.register(self._pools)
        self._worker = _WorkerCollector()
        r.register(self._worker)

    # --- event classification and invocations ------------------------------------
    def event_classified(self, *, matched: bool, functions: Collection[str] = ()) -> None:
        """One logical event classified once; ``functions`` matched it (deduped)."""
        self._globals["events_received"].inc()
        if not matched:
            self._globals["events_unmatched"].inc()
            return
        self._globals["events_matched"].inc()
        for function in set(functions):
            self._per_function["events_matched"].inc((function,))
            self._stamp(function, "last_matched_at")

    def invocation_finished(
        self, function: str, handler: str, *, ok: bool, duration_s: float | None = None
    ) -> None:
        key = "handler_success" if ok else "handler_failure"
        outcome = OUTCOME_SUCCESS if ok else OUTCOME_FAILURE
        self._globals[key].inc()
        self._per_function[key].inc((function,))
        self.handler_invocations.inc((outcome, function, handler))
        if duration_s is not None:
            self.handler_duration.observe((function, handler), duration_s)
        self._stamp(function, "last_success_at" if ok else "last_failure_at")

    def handler_invoked(
        self, function: str, handler: str, *, ok: bool, duration_s: float
    ) -> None:
        """A manual ``relay function invoke`` run: handler execution series only,
        never the delivery counters the stats persist."""
        outcome = OUTCOME_SUCCESS if ok else OUTCOME_FAILURE
        self.handler_invocations.inc((outcome, function, handler))
        self.handler_duration.observe((function, handler), duration_s)

    def retry_scheduled(self, function: str) -> None:
        self._globals["retries"].inc()
        self._per_function["retries"].inc((function,))

    def dead_lettered(self, function: str) -> None:
        self._globals["dlq_entries"].inc()
        if function != NO_FUNCTION:
            self._per_function["dlq_entries"].inc((function,))
            self._stamp(function, "last_dlq_at")

    def _stamp(self, function: str, key: str) -> None:
        at = self._clock()
        with self._lock:
            last = self._last.setdefault(function, {})
            last[key] = max(at, last.get(key, at))

    def build_finished(self, function: str, *, ok: bool, duration_s: float | None) -> None:
        if not ok:
            self.build_failures.labels(function).inc()
        if duration_s is not None:
            self.build_duration.labels(function).observe(duration_s)

    def set_backlog(self, pending: int, oldest_age_s: float, delayed: int = 0) -> None:
        self.pending_entries.set(pending)
        self.pending_oldest_age.set(oldest_age_s)
        self.delayed_entries.set(delayed)

    def watch_worker(
        self,
        *,
        in_flight: Callable[[], float],
        buffered: Callable[[], float],
        concurrency_waits: Callable[[], float],
    ) -> None:
        """Read ``in_flight_invocations``, ``buffered_events`` and
        ``concurrency_waits_total`` at scrape time from the worker's own counters
        (``Slots.in_flight``, ``MessageBuffer.occupancy``, ``Slots.waits_total``)."""
        self._worker.in_flight = in_flight
        self._worker.buffered = buffered
        self._worker.concurrency_waits = concurrency_waits

    # --- warm container pools ------------------------------------------------------
    def watch_pools(self, source: PoolSource) -> None:
        """Read ``runtime_pool_capacity`` and ``runtime_containers`` live from
        ``source`` at each scrape, so the gauges are never stale."""
        self._pools.source = source

    def container_acquired(self, function: str, outcome: str, wait_s: float) -> None:
        # No lock: the event loop is the only writer of these series and of the
        # tombstones, and a set lookup is one step.
        if function in self._removed:
            return
        self.acquires.inc((function, outcome))
        self.acquire_duration.observe((function,), wait_s)

    def container_discarded(self, function: str, reason: str) -> None:
        with self._lock:
            if function not in self._removed:
                self.discards.labels(function, reason).inc()

    def container_waited(self, function: str) -> None:
        with self._lock:
            if function not in self._removed:
                self.container_waits.labels(function).inc()

    def function_activated(self, function: str) -> None:
        """A (re)prepared function may report pool series again."""
        with self._lock:
            self._removed.discard(function)

    def function_removed(self, function: str) -> None:
        """Delete the function's series, and tombstone it so a late release from a
        busy removed container cannot recreate them."""
        with self._lock:
            self._removed.add(function)
            self._restored_discards.pop(function, None)
            self._last.pop(function, None)
            by_function: list[MetricWrapperBase] = [
                self.build_failures, self.build_duration, self.discards, self.container_waits,
            ]
            for metric in by_function:
                _remove_matching(metric, function, position=0)
            series: list[CounterSeries | HistogramSeries] = [
                *self._per_function.values(), self.handler_duration, self.acquires,
                self.acquire_duration,
            ]
            for one in series:
                one.remove_where(0, function)
            self.handler_invocations.remove_where(1, function)

    # --- persistence ---------------------------------------------------------------
    def snapshot(self) -> StatsSnapshot:
        """The cumulative counters and backlog gauges now (before any reset baseline)."""
        totals = {key: int(counter.value()) for key, counter in self._globals.items()}
        totals["pending_entries"] = int(_value(self.pending_entries))
        totals["oldest_pending_age_seconds"] = int(_value(self.pending_oldest_age))
        totals["delayed_entries"] = int(_value(self.delayed_entries))
        functions: dict[str, dict[str, int]] = {}

        def add(function: str, key: str, value: float) -> None:
            functions.setdefault(function, {})[key] = (
                functions.get(function, {}).get(key, 0) + int(value)
            )

        for key, counter in self._per_function.items():
            for labels, value in counter.items():
                add(labels[0], key, value)
        for (function, outcome), value in self.acquires.items():
            add(function, "warm_acquires" if outcome == ACQUIRE_WARM else "cold_starts", value)
        with self._lock:
            restored = dict(self._restored_discards)
            timestamps = {name: dict(last) for name, last in self._last.items()}
        for (function, _reason), value in _labelled(self.discards):
            add(function, "discarded", value)
        for function, value in restored.items():
            add(function, "discarded", value)
        return StatsSnapshot(totals=totals, functions=functions, timestamps=timestamps)

    def restore(self, persisted: StatsSnapshot) -> None:
        """Start the cumulative counters from the persisted totals, so they stay
        monotonic across restarts. Restored discards have no cause, so they are
        kept as a per-function baseline instead of a synthetic ``reason`` series."""
        for key, counter in self._globals.items():
            _inc(counter, (), persisted.total(key))
        self.set_backlog(
            persisted.total("pending_entries"), persisted.total("oldest_pending_age_seconds"),
            persisted.total("delayed_entries"),
        )
        for function in persisted.functions:
            values = persisted.function(function)
            for key, counter in self._per_function.items():
                _inc(counter, (function,), values[key])
            _inc(self.acquires, (function, ACQUIRE_WARM), values["warm_acquires"])
            _inc(self.acquires, (function, ACQUIRE_COLD), values["cold_starts"])
            if values["discarded"]:
                with self._lock:
                    self._restored_discards[function] = values["discarded"]
        with self._lock:
            for function in persisted.timestamps:
                last = self._last.setdefault(function, {})
                for key, at in persisted.last(function).items():
                    last[key] = max(at, last.get(key, at))


class _PoolCollector(Collector):
    """Live pool gauges, read from the runtime at scrape time."""

    def __init__(self) -> None:
        self.source: PoolSource | None = None

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterable[Metric]:
        capacity = GaugeMetricFamily(
            "runtime_pool_capacity", "Effective concurrency bound of the function's pool.",
            labels=["function"],
        )
        containers = GaugeMetricFamily(
            "runtime_containers", "Pooled containers by lease state.",
            labels=["function", "state"],
        )
        pools = self.source() if self.source is not None else {}
        for function, pool in sorted(pools.items()):
            capacity.add_metric([function], pool.capacity)
            containers.add_metric([function, "idle"], pool.idle)
            containers.add_metric([function, "busy"], pool.busy)
            containers.add_metric([function, "starting"], pool.starting)
        return (capacity, containers)


def _zero() -> float:
    return 0.0


class _WorkerCollector(Collector):
    """Worker-local gauges and the concurrency-wait counter, read at scrape time."""

    def __init__(self) -> None:
        self.in_flight: Callable[[], float] = _zero
        self.buffered: Callable[[], float] = _zero
        self.concurrency_waits: Callable[[], float] = _zero

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterable[Metric]:
        return (
            GaugeMetricFamily(
                "in_flight_invocations", "Invocations executing in this worker.",
                value=self.in_flight(),
            ),
            GaugeMetricFamily(
                "buffered_events", "Events held in the local buffer.", value=self.buffered()
            ),
            CounterMetricFamily(
                "concurrency_waits", "Concurrency-slot acquisitions that had to block.",
                value=self.concurrency_waits(),
            ),
        )


_HELP = {
    "events_received": "Logical events classified (received = matched + unmatched).",
    "events_matched": "Logical events that matched at least one rule.",
    "events_unmatched": "Logical events that matched no rule.",
    "handler_success": "Handler executions that succeeded.",
    "handler_failure": "Handler executions that failed.",
    "retries": "Failed invocations scheduled for another attempt.",
    "dlq_entries": "Entries written to the dead-letter stream.",
}


def _value(metric: Counter | Gauge) -> float:
    for family in metric.collect():
        for sample in family.samples:
            if sample.name in (family.name, family.name + "_total"):
                return float(sample.value)
    return 0.0


def _labelled(metric: Counter) -> list[tuple[tuple[str, ...], float]]:
    out = []
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                out.append((tuple(sample.labels.values()), float(sample.value)))
    return out


def _inc(counter: CounterSeries, labels: tuple[str, ...], amount: int) -> None:
    if amount > 0:
        counter.inc(labels, amount)


def _remove_matching(metric: MetricWrapperBase, function: str, *, position: int) -> None:
    for family in metric.collect():
        seen = set()
        for sample in family.samples:
            values = tuple(v for k, v in sample.labels.items() if k != "le")
            if len(values) > position and values[position] == function and values not in seen:
                seen.add(values)
                metric.remove(*values)
