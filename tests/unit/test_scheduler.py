"""The scheduler loop on a frozen clock: what each tick publishes, catch-up at
start, bounded publish retries, live changes, and several workers at once."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from relay.application.bus import MessageBus
from relay.application.delivery_log import subscribe_delivery_log
from relay.application.registry import ActiveFunction, FunctionRegistry
from relay.application.scheduler import Scheduler
from relay.domain import events as ev
from relay.domain import schedule
from relay.domain.messages import DomainEvent
from relay.domain.template import parse_template
from tests.fakes import FakeClock, InMemoryEventStream, InMemoryOccurrencePublisher
from tests.fakes_compose import scheduler_on

pytestmark = pytest.mark.anyio


def at(year: int, month: int, day: int, hour: int, minute: int, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


class Fleet:
    """``workers`` schedulers sharing one stream and one publisher (one Redis)."""

    def __init__(self, now: float, workers: int = 1) -> None:
        self.clock = FakeClock(now)
        self.stream = InMemoryEventStream(self.clock)
        self.publisher = InMemoryOccurrencePublisher(self.stream, self.clock)
        self.registry = FunctionRegistry()
        self.registry.mark_complete()
        self.events: list[DomainEvent] = []
        self.workers = [self._worker() for _ in range(workers)]

    def _worker(self) -> Scheduler:
        bus = MessageBus({})  # one bus per worker, as each worker process has
        subscribe_delivery_log(bus)
        for kind in (
            ev.OccurrencePublished, ev.OccurrenceDuplicate, ev.OccurrencePublishFailed,
            ev.OccurrencePublishRecovered,
        ):  # fmt: skip
            bus.subscribe(kind, self.events.append)
        return scheduler_on(
            bus, registry=self.registry, publisher=self.publisher, clock=self.clock
        )

    def function(self, name: str, *schedules: dict[str, Any], image: str | None = "img") -> None:
        template = parse_template({"runtime": "python3.14", "schedules": list(schedules)})
        self.registry.put(
            ActiveFunction(
                name=name, directory=f"/functions/{name}", template=template,
                runtime="python3.14", image=image, fingerprint=None, prepared_at=None,
            )
        )  # fmt: skip

    async def start(self) -> None:
        for worker in self.workers:
            await worker.start()

    async def run_for(self, seconds: int) -> None:
        for _ in range(seconds):
            self.clock.advance(1.0)
            for worker in self.workers:
                await worker.tick()

    def published(self) -> list[dict[str, Any]]:
        return [msgspec.json.decode(p or b"") for p in self.stream.entries.values()]

    def of(self, kind: type[DomainEvent]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def job(cron: str, handler: str = "jobs.tick.handler", **extra: Any) -> dict[str, Any]:
    return {"handler": handler, "cron": cron, **extra}


async def test_three_workers_publish_each_occurrence_once() -> None:
    fleet = Fleet(at(2026, 6, 1, 12, 0, 0), workers=3)
    fleet.function("clock", job("* * * * * *"))
    await fleet.start()
    await fleet.run_for(60)
    entries = fleet.published()
    assert len(entries) == 60
    assert [e["scheduled_at"] for e in entries] == [
        schedule.instant(at(2026, 6, 1, 12, 0, 1) + i) for i in range(60)
    ]
    assert len(fleet.of(ev.OccurrencePublished)) == 60
    assert len(fleet.of(ev.OccurrenceDuplicate)) == 120


async def test_a_five_field_cron_publishes_on_the_minute_only() -> None:
    fleet = Fleet(at(2026, 6, 1, 12, 0, 30))
    fleet.function("report", job("*/2 * * * *"))
    await fleet.start()
    await fleet.run_for(300)
    assert [e["scheduled_at"] for e in fleet.published()] == [
        "2026-06-01T12:02:00Z", "2026-06-01T12:04:00Z",
    ]  # fmt: skip


async def test_nothing_from_before_the_start_without_catchup() -> None:
    fleet = Fleet(at(2026, 6, 1, 12, 0, 30))
    fleet.function("report", job("0 12 * * *"))
    await fleet.start()
    await fleet.run_for(10)
    assert fleet.published() == []


async def test_catchup_publishes_the_latest_missed_occurrence_once() -> None:
    fleet = Fleet(at(2026, 6, 1, 12, 30, 0), workers=2)
    fleet.function(
        "report",
        job("*/10 * * * *", "jobs.caught.handler", catchup="1h"),
        job("0 0 * * *", "jobs.too_old.handler", catchup="1h"),
        job("0 13 * * *", "jobs.future.handler", catchup="24h"),
    )
    await fleet.start()
    entries = fleet.published()
    # the latest missed within the window only; nothing older, nothing in the future
    assert [(e["handler"], e["scheduled_at"]) for e in entries] == [
        ("jobs.caught.handler", "2026-06-01T12:30:00Z"),
        ("jobs.future.handler", "2026-05-31T13:00:00Z"),
    ]
    caught = fleet.of(ev.OccurrencePublished)
    assert [e.caught_up for e in caught] == [True, True]
    assert len(fleet.of(ev.OccurrenceDuplicate)) == 2  # the second worker's try
    await fleet.run_for(1)
    assert len(fleet.published()) == 2


async def test_a_failing_publish_is_retried_within_the_tick_then_counted() -> None:
    fleet = Fleet(at(2026, 6, 1, 12, 0, 0))
    fleet.function("clock", job("* * * * * *"))
    await fleet.start()
    fleet.publisher.fail_next = 2  # two failures, the third attempt publishes
    await fleet.run_for(1)
    assert len(fleet.published()) == 1
    assert fleet.of(ev.OccurrencePublishFailed) == []
    fleet.publisher.fail_next = 3  # every attempt of the next tick fails
    calls = fleet.publisher.calls
    await fleet.run_for(1)
    assert fleet.publisher.calls - calls == 3  # bounded
    [failed] = fleet.of(ev.OccurrencePublishFailed)
    assert failed.attempts == 3
    assert failed.first
    assert failed.occurrence_id == "schedule:clock:jobs.tick.handler:2026-06-01T12:00:02Z"
    assert "connection refused" in failed.error
    await fleet.run_for(1)  # the next tick is not held up by the lost one
    assert [e["scheduled_at"] for e in fleet.published()][-1] == "2026-06-01T12:00:03Z"


async def test_one_failing_worker_loses_only_its_own_tick() -> None:
    fleet = Fleet(at(2026, 6, 1, 12, 0, 0), workers=2)
    fleet.function("clock", job("* * * * * *"))
    await fleet.start()
    fleet.publisher.fail_next = 3  # the first worker's three attempts
    await fleet.run_for(1)
    assert len(fleet.published()) == 1
    assert len(fleet.of(ev.OccurrencePublishFailed)) == 1


async def test_schedule_changes_apply_at_the_next_tick() -> None:
    fleet = Fleet(at(2026, 6, 1, 12, 0, 0))
    fleet.function("fn", job("*/10 * * * * *", "jobs.a.handler"))
    await fleet.start()
    await fleet.run_for(20)
    fleet.function("fn", job("*/5 * * * * *", "jobs.a.handler"), job("0 * * * * *", "jobs.b"))
    await fleet.run_for(20)
    fleet.registry.drop("fn")
    await fleet.run_for(30)
    assert [(e["handler"], e["scheduled_at"][-3:-1]) for e in fleet.published()] == [
        ("jobs.a.handler", "10"), ("jobs.a.handler", "20"),
        ("jobs.a.handler", "25"), ("jobs.a.handler", "30"), ("jobs.a.handler", "35"),
        ("jobs.a.handler", "40"),
    ]  # fmt: skip


async def test_a_late_tick_publishes_what_it_missed_up_to_a_bound() -> None:
    fleet = Fleet(at(2026, 6, 1, 12, 0, 0))
    fleet.function("clock", job("* * * * * *"))
    await fleet.start()
    fleet.clock.advance(3600)  # the loop stalled for an hour
    await fleet.run_for(1)
    entries = fleet.published()
    assert len(entries) == 60  # MAX_LAG_S
    assert entries[-1]["scheduled_at"] == "2026-06-01T13:00:01Z"


async def test_an_outage_warns_once_and_says_when_it_is_over() -> None:
    fleet = Fleet(at(2026, 6, 1, 12, 0, 0))
    fleet.function("clock", job("* * * * * *"), job("*/2 * * * * *", "jobs.other.handler"))
    await fleet.start()
    fleet.publisher.fail_next = 3 * 6  # both schedules fail for 4 s (6 publishes, 3 tries each)
    with capture_logs() as logs:
        await fleet.run_for(4)
        await fleet.run_for(1)
    failed = fleet.of(ev.OccurrencePublishFailed)
    assert [f.first for f in failed] == [True] + [False] * 5
    assert fleet.of(ev.OccurrencePublishRecovered) == [ev.OccurrencePublishRecovered(failed=6)]
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [e["event"] for e in warnings] == ["occurrence_publish_failed"]
    infos = [e["event"] for e in logs if e["log_level"] == "info"]
    assert infos.count("occurrence_publish_recovered") == 1


async def test_a_function_that_has_never_served_publishes_nothing_yet() -> None:
    fleet = Fleet(at(2026, 6, 1, 12, 0, 0))
    fleet.function("clock", job("* * * * * *"), image=None)  # first image still building
    await fleet.start()
    await fleet.run_for(5)
    assert fleet.published() == []
    fleet.function("clock", job("* * * * * *"))  # its image is ready
    await fleet.run_for(2)
    assert [e["scheduled_at"] for e in fleet.published()] == [
        "2026-06-01T12:00:06Z", "2026-06-01T12:00:07Z",
    ]  # fmt: skip
