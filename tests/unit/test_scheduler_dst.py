"""Both Europe/Rome DST transition days of 2026, second by second on a frozen clock,
through the scheduler loop, publish-if-new and the dispatcher."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from relay.application.bus import MessageBus
from relay.domain import schedule
from tests.fakes_compose import scheduler_on
from tests.unit.delivery_world import World

pytestmark = pytest.mark.anyio

SCHEDULES = [
    {"handler": "jobs.daily.handler", "cron": "30 2 * * *", "timezone": "Europe/Rome"},
    {"handler": "jobs.half.handler", "cron": "*/30 * * * *", "timezone": "Europe/Rome"},
    {"handler": "jobs.utc.handler", "cron": "30 1 * * *"},  # UTC: DST does not apply
]


def utc(day: tuple[int, int, int], hour: int, minute: int = 0) -> float:
    return datetime(*day, hour, minute, tzinfo=UTC).timestamp()


async def run_window(day: tuple[int, int, int]) -> tuple[World, dict[str, list[str]]]:
    """23:00Z the day before to 04:00Z, every second, two workers' schedulers."""
    world = World()
    world.clock.advance(utc(day, 0) - 3600 - world.clock.now())
    world.function("jobs", {"schedules": SCHEDULES})
    workers = [
        scheduler_on(
            MessageBus({}), registry=world.registry, publisher=world.publisher, clock=world.clock
        )
        for _ in range(2)
    ]
    for worker in workers:
        await worker.start()
    for _ in range(5 * 3600):
        world.clock.advance(1.0)
        for worker in workers:
            await worker.tick()
    fired: dict[str, list[str]] = {}
    for entry_id in list(world.stream.entries):
        event: dict[str, Any] = msgspec.json.decode(world.stream.entries[entry_id] or b"")
        local = schedule.local_time(
            world.registry.current().functions["jobs"].template.schedules[
                [s["handler"] for s in SCHEDULES].index(event["handler"])
            ],
            schedule.parse_instant(event["scheduled_at"]) or 0,
        )
        fired.setdefault(event["handler"], []).append(f"{event['scheduled_at']} {local}")
    messages = await world.stream.read(1000, 0)
    for message in messages:
        assert (await world.dispatch(message)).outcome == "completed"
    return world, fired


async def test_spring_forward_on_a_frozen_clock() -> None:
    world, fired = await run_window((2026, 3, 29))
    assert fired["jobs.daily.handler"] == ["2026-03-29T01:00:00Z 2026-03-29T03:00:00+02:00"]
    assert fired["jobs.half.handler"] == [
        "2026-03-28T23:30:00Z 2026-03-29T00:30:00+01:00",
        "2026-03-29T00:00:00Z 2026-03-29T01:00:00+01:00",
        "2026-03-29T00:30:00Z 2026-03-29T01:30:00+01:00",
        # 02:00 and 02:30 do not exist that day
        "2026-03-29T01:00:00Z 2026-03-29T03:00:00+02:00",
        "2026-03-29T01:30:00Z 2026-03-29T03:30:00+02:00",
        "2026-03-29T02:00:00Z 2026-03-29T04:00:00+02:00",
        "2026-03-29T02:30:00Z 2026-03-29T04:30:00+02:00",
        "2026-03-29T03:00:00Z 2026-03-29T05:00:00+02:00",
        "2026-03-29T03:30:00Z 2026-03-29T05:30:00+02:00",
        "2026-03-29T04:00:00Z 2026-03-29T06:00:00+02:00",
    ]
    assert fired["jobs.utc.handler"] == ["2026-03-29T01:30:00Z 2026-03-29T01:30:00+00:00"]
    # every entry ran once, each handler reading exactly its instant
    daily = [r for r in world.runtime.requests if r.handler == "jobs.daily.handler"]
    assert [r.event for r in daily] == [
        b'{"source":"relay.schedule","scheduled_at":"2026-03-29T01:00:00Z"}'
    ]
    assert len(world.runtime.requests) == len(world.stream.entries) == 12


async def test_fall_back_on_a_frozen_clock() -> None:
    world, fired = await run_window((2026, 10, 25))
    # 02:30 happens twice: two instants, two occurrences, one run each
    assert fired["jobs.daily.handler"] == [
        "2026-10-25T00:30:00Z 2026-10-25T02:30:00+02:00",
        "2026-10-25T01:30:00Z 2026-10-25T02:30:00+01:00",
    ]
    half = fired["jobs.half.handler"]
    assert len(half) == 10  # every 30 minutes of real time, none lost, none doubled
    assert len({line.split()[0] for line in half}) == 10
    assert "2026-10-25T01:00:00Z 2026-10-25T02:00:00+01:00" in half
    assert "2026-10-25T00:00:00Z 2026-10-25T02:00:00+02:00" in half
    assert fired["jobs.utc.handler"] == ["2026-10-25T01:30:00Z 2026-10-25T01:30:00+00:00"]
    assert len(world.runtime.requests) == len(world.stream.entries) == 13
