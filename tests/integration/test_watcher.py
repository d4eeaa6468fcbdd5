"""Live reload against a real file watch (inotify) on a temporary functions dir."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest

from relay.adapters.fs.discovery import FsFunctionSource
from relay.adapters.fs.watcher import FunctionsWatcher
from relay.application.bus import MessageBus
from relay.application.registry import FunctionRegistry
from tests.fakes import FakeClock, InMemoryContainerRuntime, InMemoryImageBuilder, InMemorySlots
from tests.fakes_compose import reconciler_on

pytestmark = pytest.mark.anyio

TEMPLATE = """\
runtime: python3.14
events:
  - handler: main.handler
    pattern:
      event_name: [INSERT]
"""


class Recorder:
    def __init__(self) -> None:
        self.changes: list[str] = []
        self.passes = 0

    async def on_change(self, name: str) -> None:
        self.changes.append(name)

    async def on_full_pass(self) -> None:
        self.passes += 1


async def eventually(condition: Callable[[], bool], within: float = 10.0) -> None:
    with anyio.fail_after(within):
        while not condition():  # noqa: ASYNC110 - polling a condition with a deadline
            await anyio.sleep(0.02)


async def stays(condition: Callable[[], bool], window: float = 1.5) -> None:
    """Assert ``condition`` holds throughout ``window`` seconds."""
    end = anyio.current_time() + window
    while anyio.current_time() < end:
        assert condition()
        await anyio.sleep(0.05)


@pytest.fixture
async def watching(tmp_path: Path) -> AsyncIterator[tuple[Path, Recorder]]:
    functions = tmp_path / "functions"
    (functions / "fn").mkdir(parents=True)
    (functions / "fn" / "template.yaml").write_text(TEMPLATE)
    recorder = Recorder()
    watcher = FunctionsWatcher(
        functions, recorder.on_change, recorder.on_full_pass, full_pass_s=3600
    )
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run)
        yield functions, recorder
        tg.cancel_scope.cancel()


async def test_a_burst_of_saves_is_one_reconcile(watching: tuple[Path, Recorder]) -> None:
    functions, recorder = watching
    source = functions / "fn" / "main.py"
    for i in range(8):  # an editor saving repeatedly, 50 ms apart (< the 750 ms debounce)
        source.write_text(f"def handler(event):\n    return {i}\n")
        await anyio.sleep(0.05)
    await eventually(lambda: recorder.changes == ["fn"])
    await stays(lambda: recorder.changes == ["fn"])


async def test_a_nested_file_edit_reconciles_its_function_only(
    watching: tuple[Path, Recorder],
) -> None:
    functions, recorder = watching
    (functions / "other").mkdir()
    await eventually(lambda: recorder.changes == ["other"])
    nested = functions / "fn" / "events" / "users"
    nested.mkdir(parents=True)
    (nested / "created.py").write_text("def handler(event):\n    return 1\n")
    await eventually(lambda: recorder.changes == ["other", "fn"])
    await stays(lambda: recorder.changes == ["other", "fn"], window=1.0)


async def test_deleting_a_function_directory_reconciles_it(
    watching: tuple[Path, Recorder],
) -> None:
    functions, recorder = watching
    (functions / "fn" / "template.yaml").unlink()
    (functions / "fn").rmdir()
    await eventually(lambda: recorder.changes == ["fn"])


async def test_the_periodic_pass_catches_a_change_the_watch_missed(tmp_path: Path) -> None:
    functions = tmp_path / "functions"
    functions.mkdir()
    registry = FunctionRegistry()
    runtime = InMemoryContainerRuntime()

    reconciler = reconciler_on(
        MessageBus({}),
        registry=registry,
        source=FsFunctionSource(functions),
        builder=InMemoryImageBuilder(),
        runtime=runtime,
        slots=InMemorySlots(),
        clock=FakeClock(),
    )

    async def drop(_name: str) -> None:  # every watch event is lost
        return None

    async def full_pass() -> None:
        await reconciler.reconcile_all()

    watcher = FunctionsWatcher(functions, drop, full_pass, full_pass_s=0.5)
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run)
        (functions / "fn").mkdir()
        (functions / "fn" / "template.yaml").write_text(TEMPLATE)
        await eventually(lambda: "fn" in runtime.active)
        tg.cancel_scope.cancel()
    assert registry.get("fn") is not None


async def test_a_functions_dir_created_after_start_is_picked_up(tmp_path: Path) -> None:
    functions = tmp_path / "later"
    recorder = Recorder()
    watcher = FunctionsWatcher(
        functions, recorder.on_change, recorder.on_full_pass, full_pass_s=0.3
    )
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run)
        await eventually(lambda: recorder.passes >= 1)
        (functions / "fn").mkdir(parents=True)
        await eventually(lambda: recorder.passes >= 3)
        tg.cancel_scope.cancel()


def test_changed_paths_map_to_their_function(tmp_path: Path) -> None:
    async def nothing(*_args: object) -> None:
        return None

    watcher = FunctionsWatcher(tmp_path, nothing, nothing)
    assert watcher.function_of(str(tmp_path / "fn" / "a" / "b" / "c.py")) == "fn"
    assert watcher.function_of(str(tmp_path / "fn")) == "fn"
    assert watcher.function_of(str(tmp_path / ".git" / "HEAD")) is None
    assert watcher.function_of(str(tmp_path)) is None
    assert watcher.function_of("/elsewhere/fn/x.py") is None


async def test_a_constant_stream_of_changes_still_reconciles(tmp_path: Path) -> None:
    functions = tmp_path / "functions"
    (functions / "fn").mkdir(parents=True)
    recorder = Recorder()
    watcher = FunctionsWatcher(
        functions,
        recorder.on_change,
        recorder.on_full_pass,
        debounce_s=0.3,
        max_delay_s=0.6,
        full_pass_s=3600,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run)
        end = anyio.current_time() + 2.0
        while anyio.current_time() < end and not recorder.changes:
            watcher.notice("fn")  # never quiet for the debounce
            await anyio.sleep(0.1)
        tg.cancel_scope.cancel()
    assert recorder.changes[:1] == ["fn"]
