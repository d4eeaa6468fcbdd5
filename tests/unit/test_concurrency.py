"""Slots: global then per-function limits, bounded wait, live resize, wait counters."""

from __future__ import annotations

import anyio
import pytest

from relay.application.concurrency import Slots
from relay.domain.errors import RelayError
from relay.domain.execution import SlotUnavailable

pytestmark = pytest.mark.anyio


class Tracker:
    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.total_peak = 0

    def enter(self, function: str) -> None:
        self.running[function] = self.running.get(function, 0) + 1
        self.peak[function] = max(self.peak.get(function, 0), self.running[function])
        self.total_peak = max(self.total_peak, sum(self.running.values()))

    def leave(self, function: str) -> None:
        self.running[function] -= 1


async def burst(slots: Slots, tracker: Tracker, function: str, count: int) -> None:
    async def one() -> None:
        async with slots.acquire(function):
            tracker.enter(function)
            for _ in range(3):
                await anyio.lowlevel.checkpoint()
            tracker.leave(function)

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)


async def test_per_function_limit_holds_under_a_burst() -> None:
    slots = Slots(max_concurrency=8)
    slots.resize("fn", 2)
    tracker = Tracker()
    await burst(slots, tracker, "fn", 20)
    assert tracker.peak["fn"] == 2
    assert slots.waits_total > 0
    assert slots.waits_by_function["fn"] == slots.waits_total
    assert slots.in_flight == 0


async def test_global_limit_caps_all_functions_together() -> None:
    slots = Slots(max_concurrency=3)
    for name in ("a", "b"):
        slots.resize(name, 10)
    tracker = Tracker()
    async with anyio.create_task_group() as tg:
        tg.start_soon(burst, slots, tracker, "a", 10)
        tg.start_soon(burst, slots, tracker, "b", 10)
    assert tracker.total_peak == 3


def test_function_limit_is_clipped_to_max_concurrency() -> None:
    slots = Slots(max_concurrency=8)
    slots.resize("fn", 15)
    assert slots.capacity("fn") == 8
    slots.resize("fn", 0)
    assert slots.capacity("fn") == 1


async def test_no_wait_is_counted_when_a_slot_is_free() -> None:
    slots = Slots(max_concurrency=2)
    async with slots.acquire("fn"):
        assert slots.in_flight == 1
    assert slots.waits_total == 0


async def test_bounded_wait_raises_slot_unavailable_and_frees_nothing_it_did_not_take() -> None:
    slots = Slots(max_concurrency=4, wait_s=0.05)
    slots.resize("fn", 1)
    async with slots.acquire("fn"):
        with pytest.raises(SlotUnavailable) as caught:
            async with slots.acquire("fn"):
                pytest.fail("must not get a second slot")
        assert isinstance(caught.value, RelayError)
        assert "fn" in str(caught.value)
    assert slots.timeouts_total == 1
    assert slots.waits_total == 1
    # the global slot taken by the failed attempt was given back: all 4 usable
    async with (
        slots.acquire("x"),
        slots.acquire("y"),
        slots.acquire("z"),
        slots.acquire("fn"),
    ):
        assert slots.in_flight == 4


async def test_resize_up_admits_a_waiter_and_down_limits_new_acquisitions() -> None:
    slots = Slots(max_concurrency=8, wait_s=5)
    slots.resize("fn", 1)
    got_second = anyio.Event()

    async def second() -> None:
        async with slots.acquire("fn"):
            got_second.set()

    async with slots.acquire("fn"), anyio.create_task_group() as tg:
        tg.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        assert not got_second.is_set()
        slots.resize("fn", 2)
        await got_second.wait()
    slots.resize("fn", 1)
    slots_short = slots
    slots_short.wait_s = 0.05
    async with slots.acquire("fn"):
        with pytest.raises(SlotUnavailable):
            async with slots.acquire("fn"):
                pass


async def test_cancellation_while_waiting_gives_back_the_global_slot() -> None:
    slots = Slots(max_concurrency=2, wait_s=30)
    slots.resize("fn", 1)
    async with slots.acquire("fn"):
        with anyio.CancelScope() as scope:

            async def cancel_soon() -> None:
                await anyio.wait_all_tasks_blocked()
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_soon)
                async with slots.acquire("fn"):
                    pytest.fail("must not get the function slot")
        # the cancelled waiter left no slot taken behind it
        async with slots.acquire("other"):
            assert slots.in_flight == 2


async def test_a_waiter_at_its_function_limit_does_not_hold_up_other_functions() -> None:
    slots = Slots(max_concurrency=2, wait_s=30)
    slots.resize("busy", 1)
    queued = anyio.Event()

    async def waits_for_busy() -> None:
        queued.set()
        async with slots.acquire("busy"):
            pass

    async with anyio.create_task_group() as tg, slots.acquire("busy"):
        tg.start_soon(waits_for_busy)
        await queued.wait()
        await anyio.wait_all_tasks_blocked()
        async with slots.acquire("other"):  # the one free global slot, without a wait
            assert slots.in_flight == 2
        assert slots.waits_by_function == {"busy": 1}
    assert slots.in_flight == 0
    assert slots.timeouts_total == 0


async def test_a_freed_slot_goes_to_the_oldest_waiter_first() -> None:
    slots = Slots(max_concurrency=1, wait_s=30)
    order: list[int] = []

    async def one(n: int) -> None:
        async with slots.acquire("fn"):
            order.append(n)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg, slots.acquire("fn"):
        for n in range(5):
            tg.start_soon(one, n)
            await anyio.wait_all_tasks_blocked()
    assert order == [0, 1, 2, 3, 4]
    assert slots.waits_total == 5
    assert slots.in_flight == 0
