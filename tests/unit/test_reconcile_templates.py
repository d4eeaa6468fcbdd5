"""A template that crashes the YAML loader is its own function's failure: on a full
pass (the startup reconcile and every periodic one) the other functions are still
prepared, and the pass after it still runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.application.reconcile import FAILED, PREPARED, UNCHANGED
from relay.domain.commands import ReconcileAll
from relay.domain.events import FunctionPrepared, FunctionReconcileFailed
from tests.unit.test_reconcile import World

pytestmark = pytest.mark.anyio

CRASHERS = {
    "bad-date": "runtime: python3.14\nconcurrency: 2024-02-30\nevents: []\n",
    "bad-time": "runtime: python3.14\nconcurrency: 2024-01-01 25:61:61\nevents: []\n",
    "huge-int": f"runtime: python3.14\nconcurrency: {'9' * 4301}\nevents: []\n",
    "twice": "runtime: python3.14\nevents: []\nevents: []\n",
}


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_templates_the_loader_cannot_read_never_stop_another_functions_pass(
    world: World,
) -> None:
    for name, text in CRASHERS.items():
        world.write(name, template=text)
    world.write("good")

    first = await world.send(ReconcileAll())

    assert first == {**dict.fromkeys(CRASHERS, FAILED), "good": PREPARED}
    assert [p.name for p in world.of(FunctionPrepared)] == ["good"]
    failures = {f.name: f.error for f in world.of(FunctionReconcileFailed)}
    assert set(failures) == set(CRASHERS)
    for error in failures.values():
        assert error.startswith("invalid template: ")
        assert ": invalid YAML: " in error
        assert "\n" not in error
    assert "duplicate key" in failures["twice"]
    # the next periodic pass runs too, and reports nothing new
    second = await world.send(ReconcileAll())
    assert second == {**dict.fromkeys(CRASHERS, FAILED), "good": UNCHANGED}
    assert len(world.of(FunctionReconcileFailed)) == len(CRASHERS)
