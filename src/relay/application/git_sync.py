"""Git sync: the ``SyncGit`` handler, and the coalescing loop behind the webhook.

:class:`GitSyncing` handles ``SyncGit``, whoever sends it: the webhook's loop
below, or ``relay git sync`` over the control socket while a worker runs (the CLI
syncs in its own process only when no worker runs). One sync at a time per
worker; the file lock of :mod:`relay.adapters.git.sync` keeps a CLI sync of
another process out too. Every sync ends in one ``GitSyncFinished`` fact.

A webhook delivery only calls :meth:`SyncScheduler.request`, which returns at
once. One loop sends the syncs: at most one at a time, and any number of requests
that arrive while a sync runs collapse into exactly one follow-up sync, which
sees the newest commit. A failed sync never stops the loop, whatever it raised
(an unexpected exception would otherwise end the worker's task group, and with it
``relay start``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import anyio
import structlog
from anyio.abc import TaskStatus

from relay.application.bus import Emit, Outcome, Send
from relay.application.ports import GitSyncer
from relay.domain.commands import SyncGit
from relay.domain.errors import RelayError
from relay.domain.events import GitSyncFinished
from relay.domain.git import GitError, GitSyncResult

_log = structlog.get_logger("relay.git")


def _same_directory(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


class GitSyncing:
    """Handler of :class:`SyncGit` for the worker serving ``functions_dir``."""

    def __init__(self, *, syncer: GitSyncer | None, emit: Emit) -> None:
        self._syncer = syncer
        self._emit = emit
        self._one = anyio.Lock(fast_acquire=True)

    async def __call__(self, command: SyncGit) -> Outcome[GitSyncResult]:
        if self._syncer is None:
            raise GitError("this worker has no functions directory to sync")
        if command.directory is not None:
            await self._refuse_another_directory(self._syncer.functions_dir, command.directory)
        async with self._one:
            _log.info("git_sync_started", trigger=command.trigger)
            try:
                result = await self._syncer.sync_functions()
            except RelayError as exc:
                raise self._failed(str(exc)) from exc
            except OSError as exc:
                raise self._failed(f"{exc.strerror or exc}") from exc
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                raise self._failed(error, expected=False) from exc
        _log.info(
            "git_sync_succeeded", commit=result.commit, functions=len(result.functions),
            updated=result.updated or "-", removed=result.removed or "-",
        )
        self._emit(GitSyncFinished(ok=True, commit=result.commit))
        return Outcome(result)

    @staticmethod
    async def _refuse_another_directory(served: Path, asked: str) -> None:
        """``relay git sync --functions DIR`` while a worker serves another
        directory: syncing the worker's would not be what was asked for."""
        same = await anyio.to_thread.run_sync(_same_directory, served, Path(asked))
        if not same:
            raise GitError(
                f"the running worker serves {served}, not {asked}: "
                "run `relay git sync` without --functions, or stop the worker first"
            )

    def _failed(self, error: str, *, expected: bool = True) -> GitError:
        """Log and emit a failed sync; the error the sender gets (one line)."""
        if expected:
            _log.warning("git_sync_failed", error=error)
        else:
            _log.error("git_sync_failed", error=error)
        self._emit(GitSyncFinished(ok=False, error=error))
        return GitError(error)


class SyncScheduler:
    """Sends ``SyncGit`` whenever requested, never two at once, coalescing bursts."""

    def __init__(self, send: Send) -> None:
        self._send = send
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
            with contextlib.suppress(RelayError):  # logged and counted by the handler
                await self._send(SyncGit(trigger="webhook"))
