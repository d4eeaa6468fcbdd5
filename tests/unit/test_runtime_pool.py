"""FunctionPool bookkeeping: lazy starts, warm reuse, versions, shrink, removal."""

from __future__ import annotations

import anyio
import pytest

from relay.adapters.docker.pool import FunctionPool
from relay.domain.events import ContainerAcquired, ContainerDiscarded, ContainerWaited
from relay.domain.execution import RuntimeUnavailable
from relay.domain.messages import DomainEvent

pytestmark = pytest.mark.anyio


class FakeContainer:
    def __init__(self, image: str) -> None:
        self.image = image
        self.last_used = 0.0


def make_pool(capacity: int = 2) -> tuple[FunctionPool, list[DomainEvent]]:
    seen: list[DomainEvent] = []
    pool = FunctionPool(
        function="fn", image="img:1", runtime="python3.14", capacity=capacity, observe=seen.append
    )
    return pool, seen


async def cold(pool: FunctionPool) -> FakeContainer:
    assert await pool.lease() is None
    container = FakeContainer(pool.image)
    pool.started(container, 0.0)
    return container


async def test_lazy_start_then_warm_reuse() -> None:
    pool, seen = make_pool()
    first = await cold(pool)
    assert pool.release(first) is None
    again = await pool.lease()
    assert again is first
    snap = pool.snapshot()
    assert (snap.cold_starts, snap.warm_acquires, snap.busy, snap.idle) == (1, 1, 1, 0)
    outcomes = [e.outcome for e in seen if isinstance(e, ContainerAcquired)]
    assert outcomes == ["cold", "warm"]


async def test_lease_waits_at_capacity_and_counts_the_wait() -> None:
    pool, seen = make_pool(capacity=1)
    first = await cold(pool)
    got: list[object] = []

    async def second() -> None:
        got.append(await pool.lease())

    async with anyio.create_task_group() as tg:
        tg.start_soon(second)
        await anyio.wait_all_tasks_blocked()
        assert got == []
        pool.release(first)
    assert got == [first]
    assert pool.waits == 1
    assert sum(isinstance(e, ContainerWaited) for e in seen) == 1


async def test_image_change_drains_old_version() -> None:
    pool, seen = make_pool(capacity=2)
    busy_old = await cold(pool)
    idle_old = await cold(pool)
    pool.release(idle_old)
    gone = pool.activate("img:2", "python3.14", 2)
    assert gone == [idle_old]
    # the busy old container does not count against the new version's capacity
    fresh = await cold(pool)
    assert fresh.image == "img:2"
    assert pool.release(busy_old) == "image_changed"
    assert pool.release(fresh) is None
    reasons = [e.reason for e in seen if isinstance(e, ContainerDiscarded)]
    assert reasons == ["image_changed", "image_changed"]
    assert pool.snapshot().containers == 1


async def test_shrink_retires_idle_now_and_busy_on_release() -> None:
    pool, _ = make_pool(capacity=3)
    a, b, c = await cold(pool), await cold(pool), await cold(pool)
    pool.release(a)
    gone = pool.activate("img:1", "python3.14", 1)
    assert gone == [a]
    assert pool.release(b) == "concurrency_shrink"
    assert pool.release(c) is None
    assert pool.snapshot().capacity == 1
    assert pool.discards == {"concurrency_shrink": 2}


async def test_removal_is_tombstoned_and_refuses_new_leases() -> None:
    pool, seen = make_pool()
    busy = await cold(pool)
    idle = await cold(pool)
    pool.release(idle)
    seen.clear()
    assert pool.remove() == [idle]
    with pytest.raises(RuntimeUnavailable):
        await pool.lease()
    assert pool.release(busy) == "function_removed"
    assert pool.drained()
    assert not any(isinstance(e, ContainerDiscarded) for e in seen)
    # re-activation brings it back
    pool.activate("img:1", "python3.14", 2)
    assert await pool.lease() is None


async def test_idle_eviction_only_touches_old_idle_containers() -> None:
    pool, _ = make_pool(capacity=3)
    old, recent, busy = await cold(pool), await cold(pool), await cold(pool)
    pool.release(old)
    pool.release(recent)
    old.last_used, recent.last_used = 100.0, 290.0
    assert pool.evict_idle(60.0, now=300.0) == [old]
    assert pool.discards == {"idle_timeout": 1}
    assert busy in pool.busy


async def test_start_failure_frees_the_reservation() -> None:
    pool, _ = make_pool(capacity=1)
    assert await pool.lease() is None
    assert pool.snapshot().starting == 1
    pool.start_failed()
    assert pool.snapshot().starting == 0
    assert await pool.lease() is None


async def test_close_discards_idle_as_shutdown() -> None:
    pool, _ = make_pool()
    busy = await cold(pool)
    idle = await cold(pool)
    pool.release(idle)
    assert pool.close() == [idle]
    assert pool.release(busy) == "shutdown"
    assert pool.discards == {"shutdown": 2}


async def test_lease_idle_is_the_warm_path_without_waiting() -> None:
    pool, seen = make_pool()
    assert pool.lease_idle() is None  # nothing idle: the caller goes through lease()
    assert pool.snapshot().starting == 0  # and nothing was reserved
    first = await cold(pool)
    pool.release(first)
    seen.clear()
    assert pool.lease_idle() is first
    (acquired,) = seen
    assert isinstance(acquired, ContainerAcquired)
    assert acquired.outcome == "warm"
    assert pool.snapshot().warm_acquires == 1
    pool.release(first)
    pool.close()
    assert pool.lease_idle() is None


async def test_idle_eviction_keeps_everything_when_the_oldest_is_fresh() -> None:
    pool, seen = make_pool(capacity=2)
    a, b = await cold(pool), await cold(pool)
    pool.release(a)
    pool.release(b)
    a.last_used, b.last_used = 280.0, 290.0
    seen.clear()
    assert pool.evict_idle(60.0, now=300.0) == []
    assert pool.idle == [a, b]
    assert seen == []


async def test_a_new_version_container_is_kept_while_old_ones_still_run() -> None:
    # the pool's total is at capacity, but old-version busy containers do not count
    pool, _ = make_pool(capacity=2)
    old_a, old_b = await cold(pool), await cold(pool)
    assert pool.activate("img:2", "python3.14", 2) == []
    fresh = await cold(pool)
    assert fresh.image == "img:2"
    assert pool.release(fresh) is None
    assert pool.idle == [fresh]
    assert pool.release(old_a) == "image_changed"
    assert pool.release(old_b) == "image_changed"
