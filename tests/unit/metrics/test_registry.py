from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable

import anyio
import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from relay.adapters.metrics.registry import Metrics
from relay.adapters.metrics.server import (
    Backlog,
    MetricsServer,
    parse_listen_addr,
    sample_backlog,
)
from relay.domain.errors import ConfigError
from relay.domain.execution import PoolSnapshot
from relay.domain.stats import StatsSnapshot

SPEC_SERIES = {
    # counters (exposed with _total)
    "events_received", "events_matched", "events_unmatched", "handler_success",
    "handler_failure", "retries", "dlq_entries", "handler_invocations", "build_failures",
    "function_events_matched", "function_handler_success", "function_handler_failure",
    "function_retries", "function_dlq_entries", "concurrency_waits",
    "schedule_occurrences_published", "schedule_occurrences_duplicate",
    "schedule_publish_failures", "runtime_container_acquires", "runtime_container_discards",
    "runtime_container_waits",
    # histograms
    "handler_duration_seconds", "function_build_seconds",
    "runtime_container_acquire_duration_seconds",
    # gauges
    "pending_entries", "pending_oldest_age_seconds", "delayed_entries", "buffered_events",
    "in_flight_invocations", "runtime_pool_capacity", "runtime_containers",
}
ALLOWED_LABELS = {"function", "handler", "outcome", "state", "reason", "le"}


async def until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` until it holds, failing after 10 seconds."""
    with anyio.fail_after(10):
        while True:
            if predicate():
                return
            await anyio.sleep(0.01)


def pool(**kw: int) -> PoolSnapshot:
    base = dict(capacity=4, containers=2, busy=1, idle=1, starting=0,
                warm_acquires=0, cold_starts=0, discarded=0)
    base.update(kw)
    return PoolSnapshot(**base)


def exercised() -> Metrics:
    m = Metrics()
    m.event_classified(matched=True, functions=["fn", "fn", "other"])
    m.event_classified(matched=False)
    m.invocation_finished("fn", "a.h", ok=True, duration_s=0.1)
    m.invocation_finished("fn", "a.h", ok=False, duration_s=0.2)
    m.retry_scheduled("fn")
    m.dead_lettered("fn")
    m.dead_lettered("-")
    m.build_finished("fn", ok=False, duration_s=3.0)
    m.container_acquired("fn", "cold", 0.4)
    m.container_acquired("fn", "warm", 0.001)
    m.container_waited("fn")
    m.container_discarded("fn", "timeout")
    m.watch_worker(in_flight=lambda: 2, buffered=lambda: 5, concurrency_waits=lambda: 7)
    m.schedule_published.inc()
    m.schedule_duplicate.inc()
    m.schedule_failures.inc()
    m.watch_pools(lambda: {"fn": pool(busy=1, idle=2, starting=1)})
    return m


def families(m: Metrics) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    text = _exposition(m)
    return {
        f.name: [(s.name, s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def _exposition(m: Metrics) -> str:
    return generate_latest(m.registry).decode()


def test_every_spec_series_is_exposed_with_bounded_labels() -> None:
    found = families(exercised())
    assert set(found) >= SPEC_SERIES
    for samples in found.values():
        for _name, labels, _value in samples:
            assert set(labels) <= ALLOWED_LABELS


def test_own_registry_not_the_global_one() -> None:
    exercised()
    assert REGISTRY.get_sample_value("events_received_total") is None


def test_received_equals_matched_plus_unmatched() -> None:
    m = exercised()
    reg = m.registry
    received = reg.get_sample_value("events_received_total")
    matched = reg.get_sample_value("events_matched_total")
    unmatched = reg.get_sample_value("events_unmatched_total")
    assert (received, matched, unmatched) == (2, 1, 1)
    # per function: once per matched event, deduped across its rules
    assert reg.get_sample_value("function_events_matched_total", {"function": "fn"}) == 1
    assert reg.get_sample_value("function_events_matched_total", {"function": "other"}) == 1


def test_pool_and_worker_gauges_are_read_live() -> None:
    reg = exercised().registry
    assert reg.get_sample_value("in_flight_invocations") == 2
    assert reg.get_sample_value("buffered_events") == 5
    assert reg.get_sample_value("concurrency_waits_total") == 7
    assert reg.get_sample_value("runtime_pool_capacity", {"function": "fn"}) == 4
    assert reg.get_sample_value("runtime_containers", {"function": "fn", "state": "idle"}) == 2
    assert reg.get_sample_value(
        "runtime_container_acquires_total", {"function": "fn", "outcome": "cold"}
    ) == 1


def test_snapshot_reads_cumulative_counters() -> None:
    m = exercised()
    m.set_backlog(17, 134.7, 4)
    snap = m.snapshot()
    assert snap.totals == {
        "events_received": 2, "events_matched": 1, "events_unmatched": 1,
        "handler_success": 1, "handler_failure": 1, "retries": 1, "dlq_entries": 2,
        "pending_entries": 17, "oldest_pending_age_seconds": 134, "delayed_entries": 4,
    }
    assert snap.function("fn") == {
        "events_matched": 1, "handler_success": 1, "handler_failure": 1, "retries": 1,
        "dlq_entries": 1, "warm_acquires": 1, "cold_starts": 1, "discarded": 1,
    }


def test_restore_keeps_counters_monotonic_and_discards_causal() -> None:
    persisted = StatsSnapshot(
        totals={"events_received": 10, "events_matched": 7, "events_unmatched": 3},
        functions={"fn": {"events_matched": 7, "warm_acquires": 5, "cold_starts": 2,
                          "discarded": 4}},
    )
    m = Metrics()
    m.restore(persisted)
    m.event_classified(matched=True, functions=["fn"])
    m.container_discarded("fn", "idle_timeout")
    snap = m.snapshot()
    assert snap.total("events_received") == 11
    assert snap.total("events_matched") == 8
    assert snap.function("fn")["events_matched"] == 8
    assert snap.function("fn")["warm_acquires"] == 5
    assert snap.function("fn")["discarded"] == 5
    # the restored aggregate never becomes a synthetic reason series
    reasons = [s[1]["reason"] for s in families(m)["runtime_container_discards"]
               if s[0].endswith("_total")]
    assert reasons == ["idle_timeout"]


def test_function_removal_deletes_series_and_tombstones() -> None:
    m = exercised()
    m.function_removed("fn")
    m.watch_pools(dict)  # the runtime no longer reports the removed pool
    m.container_discarded("fn", "timeout")  # a late release of a busy removed container
    m.container_acquired("fn", "warm", 0.1)
    text = _exposition(m)
    assert 'function="fn"' not in text
    assert 'function="other"' in text
    m.function_activated("fn")
    m.container_acquired("fn", "cold", 0.1)
    assert m.registry.get_sample_value(
        "runtime_container_acquires_total", {"function": "fn", "outcome": "cold"}
    ) == 1
    # Series used before the removal come back fresh (no cached child of the old one).
    m.invocation_finished("fn", "a.h", ok=True, duration_s=0.1)
    m.event_classified(matched=True, functions=["fn"])
    assert m.registry.get_sample_value(
        "handler_invocations_total", {"outcome": "success", "function": "fn", "handler": "a.h"}
    ) == 1
    assert m.registry.get_sample_value("function_events_matched_total", {"function": "fn"}) == 1


def test_parse_listen_addr() -> None:
    assert parse_listen_addr(":9090") == ("0.0.0.0", 9090)
    assert parse_listen_addr("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen_addr("[::1]:9100") == ("::1", 9100)
    with pytest.raises(ConfigError):
        parse_listen_addr("nope")


@pytest.mark.anyio
async def test_metrics_server_serves_and_stops() -> None:
    m = exercised()
    server = MetricsServer(m, "127.0.0.1:0")
    async with anyio.create_task_group() as tg:
        await tg.start(server.run)
        await until(lambda: server.bound_port is not None)
        url = f"http://127.0.0.1:{server.bound_port}/metrics"
        body = await anyio.to_thread.run_sync(lambda: urllib.request.urlopen(url).read())
        assert b"events_received_total 2.0" in body
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_bind_failure_is_retried_not_fatal() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    server = MetricsServer(Metrics(), f"127.0.0.1:{port}", retry_s=0.05)
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(server.run)
            # several failed binds, and the task is still alive
            await until(lambda: sum(e["event"] == "metrics_bind_failed" for e in logs) >= 3)
            assert server.bound_port is None
            taken.close()
            await until(lambda: server.bound_port is not None)
            tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_backlog_sampler_sets_gauges_and_survives_errors() -> None:
    m = Metrics()
    replies: list[Backlog | Exception] = [
        Backlog(5, 12.5), RuntimeError("down"), Backlog(3, 1.0, 7)
    ]
    calls = 0

    async def read() -> Backlog:
        nonlocal calls
        reply = replies[min(calls, len(replies) - 1)]
        calls += 1
        if isinstance(reply, Exception):
            raise reply
        return reply

    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: sample_backlog(
            read, m, interval_s=0.01, task_status=task_status))
        await until(lambda: calls >= 4)
        tg.cancel_scope.cancel()
    assert m.registry.get_sample_value("pending_entries") == 3
    assert m.registry.get_sample_value("pending_oldest_age_seconds") == 1.0
    assert m.registry.get_sample_value("delayed_entries") == 7
