"""The coalescing sync scheduler behind the webhook.

A delivery only calls :meth:`SyncScheduler.request`, which returns at once. One
loop runs the syncs: at most one at a time, and any number of requests that
arrive while a sync runs collapse into exactly one follow-up sync, which sees
the newest commit. A failed sync is logged and counted; it never stops the loop,
whatever it raised (an unexpected exception would otherwise end the worker's
task group, and with it ``relay start``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import structlog
from anyio.abc import TaskStatus

from relay.domain.errors import RelayError
from relay.domain.events import GitSyncFinished
from relay.domain.git import SyncSummary
from relay.domain.messages import DomainEvent

_log = structlog.get_logger("relay.git")


class SyncScheduler:
    """Runs ``sync`` whenever requested, never two at once, coalescing bursts."""

    def __init__(
        self,
        sync: Callable[[], Awaitable[SyncSummary]],
        notify: Callable[[DomainEvent], None],
    ) -> None:
        self._sync = sync
        self._notify = notify
        self._wake = anyio.Event()
        self.requests = 0
        self.runs = 0  # syncs started (tests and logs)

    def request(self) -> None:
        """Ask for a sync; never blocks, never runs the sync in the caller."""
        self.requests += 1
        self._wake.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wake.wait()
            # requests from now on (during this sync) set a fresh event: one follow-up
            self._wake = anyio.Event()
            self.runs += 1
            await self._run_once()

    async def _run_once(self) -> None:
        _log.info("git_sync_started", trigger="webhook")
        try:
            summary = await self._sync()
        except RelayError as exc:
            _log.warning("git_sync_failed", error=str(exc))
            self._notify(GitSyncFinished(ok=False, error=str(exc)))
            return
        except OSError as exc:
            _log.warning("git_sync_failed", error=f"{exc.strerror or exc}")
            self._notify(GitSyncFinished(ok=False, error=str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - one sync never ends the worker
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            _log.error("git_sync_failed", error=error)
            self._notify(GitSyncFinished(ok=False, error=error))
            return
        _log.info(
            "git_sync_succeeded", commit=summary.commit, functions=summary.functions,
            updated=summary.updated or "-", removed=summary.removed or "-",
        )
        self._notify(GitSyncFinished(ok=True, commit=summary.commit))
