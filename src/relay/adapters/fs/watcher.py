"""Live reload: watch the functions directory and reconcile what changed.

Every file event (nested files included) is mapped to the function whose
directory holds it. Each function has its own trailing debounce (750 ms by
default): a burst of editor saves becomes one reconcile of that function only,
fired once the function has been quiet for the debounce (or, under a constant
stream of changes, after ``max_delay``). A full pass every 30 s is the backstop
for events the watcher missed (overflowing inotify queues, network mounts, a
functions directory created after start). The watcher only reads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus
from watchfiles import awatch

_log = structlog.get_logger(__name__)

DEBOUNCE_S = 0.75
FULL_PASS_S = 30.0


class FunctionsWatcher:
    """Calls ``on_change(name)`` per changed function and ``on_full_pass()``
    periodically. Callbacks' errors are logged, never fatal to the watcher."""

    def __init__(
        self,
        functions_dir: Path,
        on_change: Callable[[str], Awaitable[Any]],
        on_full_pass: Callable[[], Awaitable[Any]],
        *,
        debounce_s: float = DEBOUNCE_S,
        full_pass_s: float = FULL_PASS_S,
        max_delay_s: float | None = None,
        force_polling: bool = False,
    ) -> None:
        self.functions_dir = functions_dir
        self._on_change = on_change
        self._on_full_pass = on_full_pass
        self.debounce_s = debounce_s
        self.full_pass_s = full_pass_s
        self.max_delay_s = max_delay_s if max_delay_s is not None else 10 * debounce_s
        self._force_polling = force_polling
        self._due: dict[str, float] = {}  # function -> when to reconcile
        self._first: dict[str, float] = {}  # function -> first unflushed change
        self._wake = anyio.Event()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled; ``started`` once the file watch is live (or, if
        the functions directory does not exist yet, once polling for it began)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._periodic)
            tg.start_soon(self._flush, tg)
            await tg.start(self._watch)
            task_status.started()

    def notice(self, name: str) -> None:
        """Record a change to function ``name`` (the debounce restarts)."""
        now = anyio.current_time()
        first = self._first.setdefault(name, now)
        self._due[name] = min(now + self.debounce_s, first + self.max_delay_s)
        self._wake.set()

    def function_of(self, path: str) -> str | None:
        """The function a changed path belongs to (its first component)."""
        try:
            parts = Path(path).relative_to(self.functions_dir).parts
        except ValueError:
            return None
        if not parts or parts[0].startswith("."):
            return None
        return parts[0]

    # --- loops ------------------------------------------------------------------
    async def _watch(self, *, task_status: TaskStatus[None]) -> None:
        signalled = False
        while True:
            if not self.functions_dir.is_dir():
                _log.warning("functions_dir_missing", path=str(self.functions_dir))
                if not signalled:
                    signalled = True
                    task_status.started()
                await anyio.sleep(self.full_pass_s)
                continue
            try:
                async for changes in awatch(
                    self.functions_dir,
                    recursive=True,
                    step=50,
                    rust_timeout=500,
                    yield_on_timeout=True,  # the first (empty) yield means the watch is live
                    force_polling=self._force_polling,
                    ignore_permission_denied=True,
                ):
                    if not signalled:
                        signalled = True
                        task_status.started()
                    for _change, path in changes:
                        name = self.function_of(path)
                        if name is not None:
                            self.notice(name)
            except (OSError, RuntimeError) as exc:
                # The directory vanished or the OS watch failed: the periodic
                # pass keeps things converging; try to watch again shortly.
                _log.warning("functions_watch_failed", error=str(exc))
                await anyio.sleep(min(self.full_pass_s, 5.0))

    async def _flush(self, tg: TaskGroup) -> None:
        while True:
            if not self._due:
                await self._wake.wait()
                self._wake = anyio.Event()
                continue
            now = anyio.current_time()
            due = [name for name, at in self._due.items() if at <= now]
            for name in due:
                del self._due[name]
                del self._first[name]
                tg.start_soon(self._call, "function_reconcile", self._on_change, name)
            if not due:
                with anyio.move_on_after(min(self._due.values()) - now):
                    await self._wake.wait()
                    self._wake = anyio.Event()

    async def _periodic(self) -> None:
        while True:
            await anyio.sleep(self.full_pass_s)
            await self._call("full_pass", self._on_full_pass)

    async def _call(self, what: str, callback: Callable[..., Awaitable[Any]], *args: Any) -> None:
        try:
            await callback(*args)
        except Exception:  # noqa: BLE001 - a failed reconcile must not stop live reload
            _log.exception("reload_failed", step=what, args=args)
