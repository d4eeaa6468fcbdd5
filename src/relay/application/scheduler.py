"""The scheduler loop: every worker evaluates every schedule, none runs one.

Once a second, each schedule of the current catalog (``registry.current()``, so
adding, changing or removing a schedule takes effect at the next tick without a
restart) is asked for its firings since the previous tick; each firing is
sent as a ``PublishOccurrence`` command; its handler, :class:`OccurrencePublishing`,
offers it to the :class:`OccurrencePublisher`, whose atomic publish-if-new lets
exactly one worker of the fleet write its stream entry. From there it is an
ordinary message: the consumer group hands it to one worker's dispatcher.

At start, a schedule with ``catchup`` publishes the latest occurrence it missed
within that window (never a future one, never more than one); every worker may
try, the dedup key keeps it to one entry.

Only functions that serve (their first image is ready) have their schedules
evaluated. A failed publish is tried again a few times within the tick, with a short
backoff, then counted (:class:`OccurrencePublishFailed`): the tick is lost for
this worker only; the others still publish the occurrence.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio

from relay.application.bus import Emit, Outcome, Send
from relay.application.ports import CatalogSource, Clock, OccurrencePublisher
from relay.domain import schedule
from relay.domain.commands import PublishOccurrence
from relay.domain.durations import SECOND
from relay.domain.errors import DependencyUnavailable
from relay.domain.events import (
    OccurrenceDuplicate,
    OccurrencePublished,
    OccurrencePublishFailed,
    OccurrencePublishRecovered,
)
from relay.domain.template import ScheduleRule

PUBLISH_ATTEMPTS = 3
PUBLISH_BACKOFF_S = 0.05  # doubled after each failed attempt
# A tick that comes late (a stalled loop, a suspended host) looks back this far at
# most: older firings are left to catch-up at the next start.
MAX_LAG_S = 60


class Scheduler:
    """The ``scheduler`` background loop of ``relay start``."""

    def __init__(
        self,
        *,
        registry: CatalogSource,
        clock: Clock,
        send: Send,
    ) -> None:
        self._registry = registry
        self._clock = clock
        self._send = send
        self._last: int | None = None
        # each schedule's first firing after the previous tick: a tick with
        # nothing due costs a lookup, not a cron evaluation (a changed rule is
        # a new key, so it is evaluated afresh)
        self._next: dict[tuple[str, ScheduleRule], int] = {}

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        await self.start()
        task_status.started()
        while True:
            # wake just after the next whole second: 6-field crons fire every second
            await anyio.sleep(1.0 - self._clock.now() % 1.0 + 0.005)
            await self.tick()

    async def start(self) -> None:
        """Begin at the current second, after catching up what ``catchup`` asks for."""
        now = int(self._clock.now())
        self._last = now
        for function, rule in self._schedules():
            at = schedule.latest_firing(rule, now, rule.catchup_ns // SECOND)
            if at is not None:
                await self._publish(function, rule, at, caught_up=True)

    async def tick(self) -> None:
        """Publish every firing since the previous tick, up to now."""
        now = int(self._clock.now())
        if self._last is None:
            self._last = now
            return
        if now <= self._last:
            return
        since = max(self._last, now - MAX_LAG_S)
        upcoming: dict[tuple[str, ScheduleRule], int] = {}
        for function, rule in self._schedules():
            key = (function, rule)
            due = self._next.get(key)
            if due is None or due <= now:
                for at in schedule.firings(rule, since, now):
                    await self._publish(function, rule, at)
                due = schedule.next_firing(rule, now)
            upcoming[key] = due
        self._next = upcoming
        self._last = now

    def _schedules(self) -> Iterator[tuple[str, ScheduleRule]]:
        """The schedules of every function that serves. One whose first image is
        not ready (building, or its build failed) publishes nothing yet: its
        occurrences would only pile up pending, one a second for a 6-field cron."""
        catalog = self._registry.current()
        for name in sorted(catalog.functions):
            fn = catalog.functions[name]
            if fn.ready:
                for rule in fn.template.schedules:
                    yield name, rule

    async def _publish(
        self, function: str, rule: ScheduleRule, at: int, *, caught_up: bool = False
    ) -> None:
        command = PublishOccurrence(
            function=function, handler=rule.handler, at=at, caught_up=caught_up
        )
        await self._send(command)


class OccurrencePublishing:
    """Handler of :class:`PublishOccurrence`: publish-if-new with a few bounded
    attempts; every outcome is a fact emitted into the sink."""

    def __init__(
        self,
        *,
        publisher: OccurrencePublisher,
        emit: Emit,
        attempts: int = PUBLISH_ATTEMPTS,
        backoff_s: float = PUBLISH_BACKOFF_S,
    ) -> None:
        self._publisher = publisher
        self._emit = emit
        self._attempts = max(1, attempts)
        self._backoff_s = backoff_s
        self._failed = 0  # failed publishes since the last success

    async def __call__(self, command: PublishOccurrence) -> Outcome[str | None]:
        occurrence = schedule.envelope(command.function, command.handler, command.at)
        delay = self._backoff_s
        for attempt in range(1, self._attempts + 1):
            try:
                entry_id = await self._publisher.publish(occurrence)
            except DependencyUnavailable as exc:
                if attempt == self._attempts:
                    self._failed += 1
                    self._emit(
                        OccurrencePublishFailed(
                            function=command.function,
                            handler=command.handler,
                            occurrence_id=occurrence.occurrence_id,
                            attempts=attempt,
                            error=str(exc),
                            first=self._failed == 1,
                        )
                    )
                    return Outcome(None)
                await anyio.sleep(delay)
                delay *= 2
                continue
            self._published(command, occurrence.occurrence_id, entry_id)
            return Outcome(entry_id)
        return Outcome(None)  # pragma: no cover - the loop always returns

    def _published(
        self, command: PublishOccurrence, occurrence_id: str, entry_id: str | None
    ) -> None:
        if self._failed:
            self._emit(OccurrencePublishRecovered(failed=self._failed))
            self._failed = 0
        if entry_id is None:
            self._emit(
                OccurrenceDuplicate(
                    function=command.function,
                    handler=command.handler,
                    occurrence_id=occurrence_id,
                )
            )
            return
        self._emit(
            OccurrencePublished(
                function=command.function,
                handler=command.handler,
                occurrence_id=occurrence_id,
                entry_id=entry_id,
                caught_up=command.caught_up,
            )
        )
