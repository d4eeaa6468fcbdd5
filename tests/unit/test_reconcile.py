"""The reconciler on the real bus with in-memory images, runtime and slots, over
function directories in a temporary folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from relay.application.reconcile import (
    FAILED,
    PREPARED,
    REMOVED,
    SKIPPED,
    UNCHANGED,
    WAITING,
)
from relay.domain.commands import ReconcileAll, ReconcileFunction
from relay.domain.events import (
    FunctionDiscovered,
    FunctionPrepared,
    FunctionReconcileFailed,
    FunctionRemoved,
    FunctionSkipped,
)
from relay.domain.messages import DomainEvent
from tests.fakes_compose import FakeWorker

pytestmark = pytest.mark.anyio

TEMPLATE = """\
runtime: python3.14
concurrency: {concurrency}
env:
  API_URL: https://api.example.com
secrets:
  DATABASE_URL: database-url
events:
  - handler: main.handler
    pattern:
      event_name: [INSERT]
"""


class World:
    """The worker as ``composition.compose()`` wires it, on fakes; the reconciler's
    facts are recorded in ``events``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.worker = FakeWorker(root)
        self.registry = self.worker.registry
        self.builder = self.worker.builder
        self.runtime = self.worker.runtime
        self.slots = self.worker.slots
        self.clock = self.worker.clock
        self.reconciler = self.worker.composition.reconciler
        self.bus = self.worker.bus
        self.events: list[DomainEvent] = []
        for kind in (
            FunctionDiscovered,
            FunctionPrepared,
            FunctionReconcileFailed,
            FunctionRemoved,
            FunctionSkipped,
        ):
            self.bus.subscribe(kind, self.events.append)

    def write(
        self, name: str, *, concurrency: int = 2, code: str = "ok", template: str | None = None
    ) -> None:
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        text = template if template is not None else TEMPLATE.format(concurrency=concurrency)
        (directory / "template.yaml").write_text(text)
        (directory / "main.py").write_text(f"def handler(event):\n    return {code!r}\n")

    async def send(self, command: Any) -> Any:
        return await self.bus.send(command)

    def of(self, kind: type[DomainEvent]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_every_lifecycle_command_has_a_handler(world: World) -> None:
    assert set(world.reconciler.handlers()) == {ReconcileFunction, ReconcileAll}


async def test_a_new_function_is_pending_until_prepared_then_serves(world: World) -> None:
    world.write("user-events")
    world.builder.gate = anyio.Event()
    seen_pending: list[Any] = []

    async def observe() -> None:
        with anyio.fail_after(5):
            while not world.builder.prepares:  # noqa: ASYNC110 - polling with a deadline
                await anyio.sleep(0.01)
        function = world.registry.get("user-events")
        seen_pending.append(function)
        assert "user-events" not in world.runtime.active  # nothing activated yet
        assert world.builder.gate is not None
        world.builder.gate.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(observe)
        result = await world.send(ReconcileFunction(name="user-events"))

    assert result == PREPARED
    pending = seen_pending[0]
    assert pending is not None
    assert pending.image is None
    assert not pending.ready
    [discovered] = world.of(FunctionDiscovered)
    assert discovered.summary.secrets == {"DATABASE_URL": "database-url"}
    active = world.registry.get("user-events")
    assert active is not None
    assert active.ready
    assert active.image is not None
    assert active.image.startswith("relay-fn-user-events:")
    assert world.runtime.active["user-events"] == (active.image, "python3.14", 2)
    assert world.slots.capacity("user-events") == 2
    [prepared] = world.of(FunctionPrepared)
    assert prepared.fingerprint == active.fingerprint
    assert len(prepared.fingerprint) == 64
    assert prepared.built is True
    # the catalog's rule index matches the new function's events
    assert world.registry.current().index is not None


async def test_an_unchanged_function_is_not_rebuilt_nor_recorded_again(world: World) -> None:
    world.write("fn")
    assert await world.send(ReconcileAll()) == {"fn": PREPARED}
    before = list(world.events)
    assert await world.send(ReconcileAll()) == {"fn": UNCHANGED}
    assert world.events == before
    assert len(world.builder.builds) == 1


async def test_an_edit_swaps_only_after_the_new_image_is_ready(world: World) -> None:
    world.write("fn", code="v1")
    await world.send(ReconcileFunction(name="fn"))
    old = world.registry.get("fn")
    assert old is not None
    world.write("fn", code="v2")
    world.builder.gate = anyio.Event()

    async def check_old_still_serves() -> None:
        with anyio.fail_after(5):
            while len(world.builder.prepares) < 2:  # noqa: ASYNC110 - polling with a deadline
                await anyio.sleep(0.01)
        assert world.registry.get("fn") == old
        assert world.runtime.active["fn"][0] == old.image
        assert world.builder.gate is not None
        world.builder.gate.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(check_old_still_serves)
        assert await world.send(ReconcileFunction(name="fn")) == PREPARED

    new = world.registry.get("fn")
    assert new is not None
    assert new.image != old.image
    assert world.runtime.active["fn"][0] == new.image
    assert world.builder.retired[-1] == ("fn", (new.image,))
    assert old.image in world.builder.removed_images


async def test_a_failed_build_keeps_the_old_version_and_records_the_failure(world: World) -> None:
    world.write("fn", code="v1")
    await world.send(ReconcileFunction(name="fn"))
    old = world.registry.get("fn")
    assert old is not None
    world.write("fn", code="v2")
    world.builder.failures["fn"] = "build failed: pip exited 1"

    assert await world.send(ReconcileFunction(name="fn")) == FAILED

    assert world.registry.get("fn") == old
    assert world.runtime.active["fn"][0] == old.image
    [failed] = world.of(FunctionReconcileFailed)
    assert failed.error == "build failed: pip exited 1"
    assert failed.image == old.image
    assert failed.fingerprint == old.fingerprint
    # the periodic pass retries, but the same failure is not recorded twice
    assert await world.send(ReconcileAll()) == {"fn": FAILED}
    assert len(world.of(FunctionReconcileFailed)) == 1
    # fixed: the new version serves and success is recorded
    del world.builder.failures["fn"]
    assert await world.send(ReconcileAll()) == {"fn": PREPARED}
    assert world.registry.get("fn") != old


async def test_an_invalid_template_keeps_the_old_version(world: World) -> None:
    world.write("fn")
    await world.send(ReconcileFunction(name="fn"))
    old = world.registry.get("fn")
    world.write("fn", template="runtime: cobol\nevents: []\n")

    assert await world.send(ReconcileFunction(name="fn")) == FAILED

    assert world.registry.get("fn") == old
    [failed] = world.of(FunctionReconcileFailed)
    assert failed.error.startswith("invalid template:")
    assert "runtime" in failed.error


async def test_a_first_build_failure_leaves_the_function_pending_and_unavailable(
    world: World,
) -> None:
    world.write("fn")
    world.builder.failures["fn"] = "no such base image"
    assert await world.send(ReconcileFunction(name="fn")) == FAILED
    pending = world.registry.get("fn")
    assert pending is not None
    assert not pending.ready
    assert pending.last_error == "no such base image"
    assert "fn" not in world.runtime.active
    [failed] = world.of(FunctionReconcileFailed)
    assert failed.image is None
    assert failed.summary is not None


async def test_a_missing_template_keeps_the_previous_version(world: World) -> None:
    world.write("fn")
    await world.send(ReconcileFunction(name="fn"))
    old = world.registry.get("fn")
    (world.root / "fn" / "template.yaml").unlink()

    assert await world.send(ReconcileFunction(name="fn")) == WAITING
    assert await world.send(ReconcileAll()) == {"fn": WAITING}

    assert world.registry.get("fn") == old
    assert "fn" in world.runtime.active
    assert not world.of(FunctionRemoved)


async def test_a_directory_without_template_is_not_a_function(world: World) -> None:
    (world.root / "notes").mkdir()
    assert await world.send(ReconcileFunction(name="notes")) == SKIPPED
    assert await world.send(ReconcileAll()) == {}
    assert world.events == []


async def test_an_invalid_name_is_skipped_and_reported_once(world: World) -> None:
    world.write("Bad_Name")
    world.write("good")
    assert await world.send(ReconcileAll()) == {"Bad_Name": SKIPPED, "good": PREPARED}
    await world.send(ReconcileAll())
    [skipped] = world.of(FunctionSkipped)
    assert skipped.name == "Bad_Name"
    assert "invalid function name" in skipped.reason
    assert world.registry.get("Bad_Name") is None


async def test_removal_drops_the_function_and_retires_its_images(world: World) -> None:
    world.write("fn")
    world.write("other")
    await world.send(ReconcileAll())
    image = world.runtime.active["fn"][0]
    world.builder.in_use.add(image)  # a busy container still runs the old version
    for path in sorted((world.root / "fn").iterdir()):
        path.unlink()
    (world.root / "fn").rmdir()

    assert await world.send(ReconcileAll()) == {"fn": REMOVED, "other": UNCHANGED}

    assert world.registry.get("fn") is None
    assert world.runtime.removed == ["fn"]
    assert world.slots.capacity("fn") == world.slots.max_concurrency  # its limit is gone
    assert ("fn", ()) in world.builder.retired
    [removed] = world.of(FunctionRemoved)
    assert removed.name == "fn"
    assert image not in world.builder.removed_images  # in-flight work protected
    # the container drained: the next pass retries and the image goes
    world.builder.in_use.clear()
    await world.send(ReconcileAll())
    assert image in world.builder.removed_images


async def test_a_concurrency_change_resizes_slots_and_pool(world: World) -> None:
    world.write("fn", concurrency=2)
    await world.send(ReconcileFunction(name="fn"))
    world.write("fn", concurrency=15)

    assert await world.send(ReconcileFunction(name="fn")) == PREPARED

    assert world.slots.capacity("fn") == 8  # min(15, MAX_CONCURRENCY)
    assert world.runtime.active["fn"][2] == 8


async def test_reconciles_of_one_function_never_overlap(world: World) -> None:
    world.write("fn")
    world.builder.gate = anyio.Event()
    running = 0
    overlap = 0
    original = world.builder.prepare

    async def counting(*args: Any) -> Any:
        nonlocal running, overlap
        running += 1
        overlap = max(overlap, running)
        try:
            return await original(*args)
        finally:
            running -= 1

    world.builder.prepare = counting  # type: ignore[method-assign,assignment]

    async def release() -> None:
        await anyio.sleep(0.2)
        assert world.builder.gate is not None
        world.builder.gate.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(release)
        for _ in range(3):
            tg.start_soon(world.send, ReconcileFunction(name="fn"))
    assert overlap == 1
    assert len(world.builder.builds) == 1


async def test_a_pending_function_is_announced_once(world: World) -> None:
    world.write("fn")
    world.builder.failures["fn"] = "no base image"
    await world.send(ReconcileAll())
    await world.send(ReconcileAll())
    assert len(world.of(FunctionDiscovered)) == 1
    assert len(world.of(FunctionReconcileFailed)) == 1


async def test_a_function_known_only_by_its_failure_is_removed_with_its_folder(
    world: World,
) -> None:
    world.write("fn", template="runtime: python3.14\nevents: nope\n")
    assert await world.send(ReconcileAll()) == {"fn": FAILED}
    assert world.registry.get("fn") is None
    for path in sorted((world.root / "fn").iterdir()):
        path.unlink()
    (world.root / "fn").rmdir()
    assert await world.send(ReconcileAll()) == {"fn": REMOVED}
    [removed] = world.of(FunctionRemoved)
    assert removed.name == "fn"
    assert await world.send(ReconcileAll()) == {}


async def test_reverting_a_broken_edit_restores_success_without_a_new_version(
    world: World,
) -> None:
    world.write("fn", code="v1")
    await world.send(ReconcileFunction(name="fn"))
    good = world.registry.get("fn")
    assert good is not None
    world.write("fn", template="runtime: cobol\n")
    assert await world.send(ReconcileFunction(name="fn")) == FAILED
    world.clock.advance(60)
    world.write("fn", code="v1")
    assert await world.send(ReconcileFunction(name="fn")) == PREPARED
    again = world.registry.get("fn")
    assert again is not None
    assert again.image == good.image
    assert again.prepared_at == good.prepared_at
    assert len(world.builder.builds) == 1
    assert len(world.of(FunctionPrepared)) == 2  # success is recorded again
    confirmed = world.of(FunctionPrepared)[-1]
    assert confirmed.prepared_at == good.prepared_at
    assert confirmed.at == world.clock.now()


async def test_images_of_a_function_deleted_while_down_are_retired_at_the_first_pass(
    world: World,
) -> None:
    world.builder.images["gone"] = {"relay-fn-gone:0000000000000000"}
    world.write("kept")
    world.reconciler.add_leftovers(["gone", "kept"])
    await world.send(ReconcileAll())
    assert world.builder.removed_images == ["relay-fn-gone:0000000000000000"]
    assert ("kept", (world.runtime.active["kept"][0],)) in world.builder.retired


async def test_a_removal_after_several_passes_still_retries_its_retire(world: World) -> None:
    world.write("fn")
    await world.send(ReconcileAll())
    for _ in range(5):  # the retries left over from the first swap run out
        await world.send(ReconcileAll())
    image = world.runtime.active["fn"][0]
    world.builder.in_use.add(image)  # the idle container is still being removed
    for path in sorted((world.root / "fn").iterdir()):
        path.unlink()
    (world.root / "fn").rmdir()
    await world.send(ReconcileAll())
    assert image not in world.builder.removed_images
    world.builder.in_use.clear()
    await world.send(ReconcileAll())
    assert image in world.builder.removed_images


async def test_a_vanished_functions_directory_removes_nothing(world: World) -> None:
    world.write("fn")
    await world.send(ReconcileAll())
    hidden = world.root.with_name(world.root.name + "-away")
    world.root.rename(hidden)  # a remount or a checkout swapping the folder
    try:
        assert await world.send(ReconcileAll()) == {}
        assert await world.send(ReconcileFunction(name="fn")) == WAITING
        assert world.registry.get("fn") is not None
        assert "fn" in world.runtime.active
        assert not world.of(FunctionRemoved)
    finally:
        hidden.rename(world.root)
