from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from relay.adapters.metrics.registry import Metrics
from relay.adapters.metrics.subscribers import InstrumentedImageBuilder, subscribe
from relay.application.bus import MessageBus
from relay.domain import events as ev
from relay.domain.errors import BuildError
from relay.domain.functions import FunctionImage
from tests.fakes_compose import deliver

pytestmark = pytest.mark.anyio


def wired() -> tuple[MessageBus, Metrics]:
    bus, metrics = MessageBus({}), Metrics()
    subscribe(bus, metrics)
    return bus, metrics


async def test_delivery_events_feed_the_counters() -> None:
    bus, m = wired()
    await deliver(bus, [
        ev.EventClassified(message_id="1-0", matched=True, functions=("fn", "other")),
        ev.EventClassified(message_id="2-0", matched=False),
        ev.InvocationSucceeded(function="fn", handler="h.a", message_id="1-0", attempt=1,
                               duration_s=0.2),
        ev.InvocationFailed(function="other", handler="h.b", message_id="1-0", attempt=1,
                            duration_s=0.1, error="boom", retry_in_s=60),
        ev.InvocationExhausted(function="other", handler="h.b", message_id="1-0", attempt=5,
                               duration_s=0.0, error="boom"),
        ev.MessageDeadLettered(function="other", handler="h.b", message_id="1-0",
                               entry_id="9-0", handler_attempts=5, reason="boom"),
        ev.MessageDeadLettered(function="-", handler="-", message_id="3-0",
                               entry_id="9-1", handler_attempts=0, reason="malformed"),
    ])
    snap = m.snapshot()
    assert snap.total("events_received") == snap.total("events_matched") + snap.total(
        "events_unmatched"
    ) == 2
    assert snap.total("handler_success") == 1
    assert snap.total("handler_failure") == 2
    assert snap.total("retries") == 1
    assert snap.total("dlq_entries") == 2
    assert snap.function("other")["dlq_entries"] == 1
    assert "-" not in snap.functions
    reg = m.registry
    assert reg.get_sample_value(
        "handler_invocations_total", {"outcome": "failure", "function": "other", "handler": "h.b"}
    ) == 2
    # the exhausted attempt without a result adds no duration sample
    assert reg.get_sample_value(
        "handler_duration_seconds_count", {"function": "other", "handler": "h.b"}
    ) == 1


async def test_pool_events_and_removal() -> None:
    bus, m = wired()
    await deliver(bus, [
        ev.ContainerAcquired(function="fn", outcome="cold", wait_s=0.3),
        ev.ContainerAcquired(function="fn", outcome="warm", wait_s=0.0),
        ev.ContainerWaited(function="fn"),
        ev.ContainerDiscarded(function="fn", reason="timeout"),
    ])
    assert m.snapshot().function("fn") | {} == {
        "events_matched": 0, "handler_success": 0, "handler_failure": 0, "retries": 0,
        "dlq_entries": 0, "warm_acquires": 1, "cold_starts": 1, "discarded": 1,
    }
    await deliver(bus, [ev.FunctionRemoved(name="fn", at=0.0),
                       ev.ContainerDiscarded(function="fn", reason="timeout")])
    assert "fn" not in m.snapshot().functions


class NoRules:
    runtime = "python3.14"
    events: tuple[Any, ...] = ()
    schedules: tuple[Any, ...] = ()


class StubBuilder:
    def __init__(self, *, built: bool, fail: bool = False) -> None:
        self.built, self.fail = built, fail

    async def prepare(self, function: str, directory: Path, template: Any) -> FunctionImage:
        if self.fail:
            raise BuildError("step failed")
        return FunctionImage(function=function, runtime="python3.14", fingerprint="f" * 64,
                             image="relay-fn-x:1", dependency_image=None, built=self.built)

    async def retire(self, function: str, keep: Collection[str]) -> list[str]:
        return []

    async def collect_dependency_images(self) -> list[str]:
        return []


async def test_instrumented_builder_times_builds_and_counts_failures(tmp_path: Path) -> None:
    m = Metrics()
    await InstrumentedImageBuilder(StubBuilder(built=True), m).prepare("fn", tmp_path, NoRules())
    await InstrumentedImageBuilder(StubBuilder(built=False), m).prepare("fn", tmp_path, NoRules())
    with pytest.raises(BuildError):
        await InstrumentedImageBuilder(StubBuilder(built=True, fail=True), m).prepare(
            "fn", tmp_path, NoRules()
        )
    reg = m.registry
    assert reg.get_sample_value("function_build_seconds_count", {"function": "fn"}) == 1
    assert reg.get_sample_value("build_failures_total", {"function": "fn"}) == 1


async def test_schedule_events_feed_their_counters_and_no_event_counter() -> None:
    bus, m = wired()
    occ = "schedule:fn:jobs.a:2026-06-01T03:00:00Z"
    await deliver(bus, [
        ev.OccurrencePublished(function="fn", handler="jobs.a", occurrence_id=occ, entry_id="1-0"),
        ev.OccurrencePublished(function="fn", handler="jobs.a", occurrence_id=occ, entry_id="2-0",
                               caught_up=True),
        ev.OccurrenceDuplicate(function="fn", handler="jobs.a", occurrence_id=occ),
        ev.OccurrencePublishFailed(function="fn", handler="jobs.a", occurrence_id=occ,
                                   attempts=3, error="down"),
        ev.OccurrenceObsolete(function="fn", handler="jobs.a", message_id="1-0",
                              occurrence_id=occ),
        ev.OccurrenceSkipped(function="fn", handler="jobs.b", message_id="2-0",
                             occurrence_id=occ),
    ])
    reg = m.registry
    assert reg.get_sample_value("schedule_occurrences_published_total") == 2
    assert reg.get_sample_value("schedule_occurrences_duplicate_total") == 1
    assert reg.get_sample_value("schedule_publish_failures_total") == 1
    labels = {"function": "fn", "handler": "jobs.a"}
    assert reg.get_sample_value("schedule_occurrences_caught_up_total", labels) == 1
    assert reg.get_sample_value("schedule_occurrences_obsolete_total", labels) == 1
    assert reg.get_sample_value(
        "schedule_occurrences_skipped_total", {"function": "fn", "handler": "jobs.b"}
    ) == 1
    assert m.snapshot().total("events_received") == 0
