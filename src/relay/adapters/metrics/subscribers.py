"""Metrics as a subscriber of domain events: the bus feeds every counter.

``subscribe(bus, metrics)`` registers one small function per event type. The
handlers never decide anything; they only count (and the bus isolates a
subscriber that raises).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path

from relay.adapters.metrics.registry import OUTCOME_FAILURE, OUTCOME_SUCCESS, Metrics
from relay.application.bus import MessageBus
from relay.application.ports import ImageBuilder
from relay.domain import events as ev
from relay.domain.errors import BuildError
from relay.domain.functions import BuildTemplate, FunctionImage


def subscribe(bus: MessageBus, metrics: Metrics) -> None:
    """Wire every event Relay's metrics observe."""
    m = metrics

    def classified(e: ev.EventClassified) -> None:
        m.event_classified(matched=e.matched, functions=e.functions)

    def succeeded(e: ev.InvocationSucceeded) -> None:
        m.invocation_finished(e.function, e.handler, ok=True, duration_s=e.duration_s)

    def failed(e: ev.InvocationFailed) -> None:
        m.invocation_finished(e.function, e.handler, ok=False, duration_s=e.duration_s)
        m.retry_scheduled(e.function)

    def exhausted(e: ev.InvocationExhausted) -> None:
        # duration 0: the worker died before a result; the attempt still failed
        duration = e.duration_s if e.duration_s > 0 else None
        m.invocation_finished(e.function, e.handler, ok=False, duration_s=duration)

    def invoked(e: ev.HandlerInvoked) -> None:
        m.handler_invoked(e.function, e.handler, ok=e.ok, duration_s=e.duration_s)

    def dead_lettered(e: ev.MessageDeadLettered) -> None:
        m.dead_lettered(e.function)

    def prepared(e: ev.FunctionPrepared) -> None:
        m.function_activated(e.name)

    def removed(e: ev.FunctionRemoved) -> None:
        m.function_removed(e.name)

    def acquired(e: ev.ContainerAcquired) -> None:
        m.container_acquired(e.function, e.outcome, e.wait_s)

    def discarded(e: ev.ContainerDiscarded) -> None:
        m.container_discarded(e.function, e.reason)

    def waited(e: ev.ContainerWaited) -> None:
        m.container_waited(e.function)

    def git_synced(e: ev.GitSyncFinished) -> None:
        m.git_syncs.labels(outcome=OUTCOME_SUCCESS if e.ok else OUTCOME_FAILURE).inc()

    def git_delivered(e: ev.GitWebhookDelivered) -> None:
        m.git_webhook_deliveries.labels(outcome=e.outcome).inc()

    _subscribe_schedules(bus, m)
    bus.subscribe(ev.GitSyncFinished, git_synced)
    bus.subscribe(ev.GitWebhookDelivered, git_delivered)
    bus.subscribe(ev.EventClassified, classified)
    bus.subscribe(ev.InvocationSucceeded, succeeded)
    bus.subscribe(ev.InvocationFailed, failed)
    bus.subscribe(ev.InvocationExhausted, exhausted)
    bus.subscribe(ev.HandlerInvoked, invoked)
    bus.subscribe(ev.MessageDeadLettered, dead_lettered)
    bus.subscribe(ev.FunctionPrepared, prepared)
    bus.subscribe(ev.FunctionRemoved, removed)
    bus.subscribe(ev.ContainerAcquired, acquired)
    bus.subscribe(ev.ContainerDiscarded, discarded)
    bus.subscribe(ev.ContainerWaited, waited)


def _subscribe_schedules(bus: MessageBus, m: Metrics) -> None:
    """Publication counters per worker; obsolete, skipped and caught-up ones per schedule."""

    def published(e: ev.OccurrencePublished) -> None:
        m.schedule_published.inc()
        if e.caught_up:
            m.schedule_caught_up.labels(function=e.function, handler=e.handler).inc()

    bus.subscribe(ev.OccurrencePublished, published)
    bus.subscribe(ev.OccurrenceDuplicate, lambda _e: m.schedule_duplicate.inc())
    bus.subscribe(ev.OccurrencePublishFailed, lambda _e: m.schedule_failures.inc())
    bus.subscribe(
        ev.OccurrenceObsolete,
        lambda e: m.schedule_obsolete.labels(function=e.function, handler=e.handler).inc(),
    )
    bus.subscribe(
        ev.OccurrenceSkipped,
        lambda e: m.schedule_skipped.labels(function=e.function, handler=e.handler).inc(),
    )


class InstrumentedImageBuilder:
    """An :class:`ImageBuilder` that times real builds (``function_build_seconds``)
    and counts failed ones (``build_failures_total``); everything else passes through."""

    def __init__(self, inner: ImageBuilder, metrics: Metrics) -> None:
        self._inner = inner
        self._metrics = metrics

    async def prepare(
        self, function: str, directory: Path, template: BuildTemplate
    ) -> FunctionImage:
        started = time.monotonic()
        try:
            image = await self._inner.prepare(function, directory, template)
        except BuildError:
            self._metrics.build_finished(function, ok=False, duration_s=None)
            raise
        if image.built:
            self._metrics.build_finished(
                function, ok=True, duration_s=time.monotonic() - started
            )
        return image

    async def retire(self, function: str, keep: Collection[str]) -> list[str]:
        return await self._inner.retire(function, keep)

    async def collect_dependency_images(self) -> list[str]:
        return await self._inner.collect_dependency_images()
