"""The ContainerRuntime contract, on the in-memory fake and on Docker with a tiny
Python function image (the real bootstrap and ``tests/integration/runtime_app``).

The fake's handlers are scripted to answer as the probe app's do in a container;
what is proven is the port's shape around them: a handler failure or a timeout is
a result (not an exception), what the pool keeps or discards, and the gauges and
counters ``snapshot`` reports."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from relay.application.ports import ContainerRuntime
from relay.domain.execution import (
    DISCARD_TIMEOUT,
    InvocationRequest,
    InvocationResult,
    LeaseLost,
    PoolSnapshot,
    RuntimeUnavailable,
    failure_message,
)
from tests.fakes import InMemoryContainerRuntime
from tests.integration.runtime_support import built_image, runtime_for
from tests.shared_run import SharedImages

pytestmark = pytest.mark.anyio

PY = "python3.14"
FN = "probe-fn"
HALF_SECOND_NS = 500_000_000


@pytest.fixture(scope="module")
def images(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Two versions of the function image (Docker only; the fake needs none)."""
    shared: SharedImages = request.getfixturevalue("shared_images")
    v1 = built_image(shared, PY, "ENV APP_VERSION=1")
    return v1, built_image(shared, PY, "ENV APP_VERSION=2")


def _sleep(request: InvocationRequest) -> InvocationResult:
    """``probe.sleep`` as a container runs it: past its timeout, the runtime gives up."""
    asked_s = json.loads(request.event)["s"]
    timeout_s = request.timeout_ns / 1e9
    if asked_s < timeout_s:
        return InvocationResult(ok=True)
    detail = f"timed out after {timeout_s:g}s"
    return InvocationResult(
        ok=False, error=failure_message(FN, "probe.sleep", detail), discarded=DISCARD_TIMEOUT
    )


def scripted_fake() -> InMemoryContainerRuntime:
    fake = InMemoryContainerRuntime()
    fake.script[f"{FN}/probe.fail"] = InvocationResult(
        ok=False, error=failure_message(FN, "probe.fail", "ValueError: boom from the handler")
    )
    fake.script[f"{FN}/probe.sleep"] = _sleep
    return fake


class Bed:
    def __init__(self, runtime: ContainerRuntime, images: tuple[str, str]) -> None:
        self.runtime = runtime
        self.v1, self.v2 = images


@pytest.fixture(params=["memory", pytest.param("docker", marks=pytest.mark.docker)])
async def bed(request: pytest.FixtureRequest, unique: str) -> AsyncIterator[Bed]:
    if request.param == "memory":
        yield Bed(scripted_fake(), ("relay-fn-probe-fn:v1", "relay-fn-probe-fn:v2"))
        return
    images: tuple[str, str] = request.getfixturevalue("images")
    async with runtime_for(f"w-{unique}") as (runtime, _, _):
        yield Bed(runtime, images)


def call(handler: str, event: dict[str, Any] | None = None, **kw: Any) -> InvocationRequest:
    return InvocationRequest(
        function=FN, handler=handler, event=json.dumps(event or {}).encode(), **kw
    )


def counts(snapshot: PoolSnapshot | None) -> tuple[int, int, int, int, int, int]:
    assert snapshot is not None
    s = snapshot
    return (s.containers, s.busy, s.idle, s.warm_acquires, s.cold_starts, s.discarded)


async def test_an_unknown_function_is_unavailable_and_has_no_snapshot(bed: Bed) -> None:
    with pytest.raises(RuntimeUnavailable, match=f'^function "{FN}" is not active$'):
        await bed.runtime.invoke(call("probe.hello"))
    assert bed.runtime.snapshot(FN) is None


async def test_a_run_starts_a_container_once_and_then_reuses_it(bed: Bed) -> None:
    bed.runtime.activate(FN, bed.v1, PY, 2)
    assert bed.runtime.snapshot(FN) == PoolSnapshot(
        capacity=2, containers=0, busy=0, idle=0, starting=0,
        warm_acquires=0, cold_starts=0, discarded=0)
    first = await bed.runtime.invoke(call("probe.hello", {"n": 1}))
    assert (first.ok, first.error, first.exit_code, first.discarded) == (True, "", None, None)
    assert counts(bed.runtime.snapshot(FN)) == (1, 0, 1, 0, 1, 0)
    assert (await bed.runtime.invoke(call("probe.hello", {"n": 2}))).ok
    assert counts(bed.runtime.snapshot(FN)) == (1, 0, 1, 1, 1, 0)


async def test_a_handler_error_is_a_one_line_result_and_keeps_the_container(bed: Bed) -> None:
    bed.runtime.activate(FN, bed.v1, PY, 1)
    failed = await bed.runtime.invoke(call("probe.fail"))
    assert not failed.ok
    assert failed.error.startswith(f'function "{FN}" handler "probe.fail": ')
    assert "boom from the handler" in failed.error
    assert "\n" not in failed.error
    assert (failed.exit_code, failed.discarded) == (None, None)
    assert counts(bed.runtime.snapshot(FN)) == (1, 0, 1, 0, 1, 0)


async def test_a_timeout_is_a_result_and_discards_the_container(bed: Bed) -> None:
    bed.runtime.activate(FN, bed.v1, PY, 1)
    late = await bed.runtime.invoke(call("probe.sleep", {"s": 30}, timeout_ns=HALF_SECOND_NS))
    assert not late.ok
    assert late.error == failure_message(FN, "probe.sleep", "timed out after 0.5s")
    assert late.discarded == DISCARD_TIMEOUT
    assert counts(bed.runtime.snapshot(FN)) == (0, 0, 0, 0, 1, 1)
    assert (await bed.runtime.invoke(call("probe.hello"))).ok  # a fresh container
    assert counts(bed.runtime.snapshot(FN)) == (1, 0, 1, 0, 2, 1)


async def test_a_failing_start_guard_propagates_and_returns_the_container(bed: Bed) -> None:
    bed.runtime.activate(FN, bed.v1, PY, 1)

    async def lost() -> None:
        raise LeaseLost("lease_lost", "another worker holds the claim")

    with pytest.raises(LeaseLost):
        await bed.runtime.invoke(call("probe.hello"), guard=lost)
    assert counts(bed.runtime.snapshot(FN)) == (1, 0, 1, 0, 1, 0)


async def test_capacity_is_at_least_one(bed: Bed) -> None:
    bed.runtime.activate(FN, bed.v1, PY, 0)
    snapshot = bed.runtime.snapshot(FN)
    assert snapshot is not None
    assert snapshot.capacity == 1


async def test_a_new_image_drains_the_idle_containers_of_the_old(bed: Bed) -> None:
    bed.runtime.activate(FN, bed.v1, PY, 1)
    assert (await bed.runtime.invoke(call("probe.hello"))).ok
    bed.runtime.activate(FN, bed.v2, PY, 3)
    snapshot = bed.runtime.snapshot(FN)
    assert snapshot is not None
    assert snapshot.capacity == 3
    assert counts(snapshot) == (0, 0, 0, 0, 1, 1)
    assert (await bed.runtime.invoke(call("probe.hello"))).ok
    assert counts(bed.runtime.snapshot(FN)) == (1, 0, 1, 0, 2, 1)


async def test_remove_makes_the_function_unknown_until_activated_again(bed: Bed) -> None:
    bed.runtime.activate(FN, bed.v1, PY, 1)
    assert (await bed.runtime.invoke(call("probe.hello"))).ok
    bed.runtime.remove(FN)
    assert bed.runtime.snapshot(FN) is None
    with pytest.raises(RuntimeUnavailable):
        await bed.runtime.invoke(call("probe.hello"))
    bed.runtime.remove(FN)  # removing an unknown function is fine
    bed.runtime.activate(FN, bed.v1, PY, 1)
    assert counts(bed.runtime.snapshot(FN)) == (0, 0, 0, 0, 0, 0)  # a new pool
    assert (await bed.runtime.invoke(call("probe.hello"))).ok


async def test_after_aclose_nothing_runs(bed: Bed) -> None:
    bed.runtime.activate(FN, bed.v1, PY, 1)
    assert (await bed.runtime.invoke(call("probe.hello"))).ok
    await bed.runtime.aclose()
    with pytest.raises(RuntimeUnavailable):
        await bed.runtime.invoke(call("probe.hello"))
    assert counts(bed.runtime.snapshot(FN)) == (0, 0, 0, 0, 1, 1)
