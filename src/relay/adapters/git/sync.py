"""One git sync: lock, fetch and check out, replace the functions, record.

A CLI sync and the worker's webhook sync take the same lock
(``git/sync.lock``, ``flock``), so two syncs never interleave. The CLI refuses
at once when the lock is held; the worker waits for it. The functions directory
changes only after the checkout succeeded and every function was staged (see
:mod:`relay.adapters.git.replace`): a failure anywhere earlier leaves it as the
last good sync left it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import structlog

from relay.adapters.git.checkout import GitCheckout
from relay.adapters.git.files import GitPaths, private_dir
from relay.adapters.git.replace import ReplaceResult, replace_functions
from relay.adapters.git.ssh import TrustedHost
from relay.adapters.git.store import GitStore, SyncState
from relay.domain.git import GitError, GitSource, GitSyncResult, SyncSummary

LOCK_POLL_S = 0.2
_log = structlog.get_logger("relay.git")


class SyncBusy(GitError):
    """Another sync holds the lock."""


@dataclass(frozen=True, slots=True)
class SyncReport:
    """What one successful sync did."""

    repository: str
    ref: str
    commit: str
    result: ReplaceResult
    trusted: list[TrustedHost] = field(default_factory=list)

    def summary(self) -> SyncSummary:
        return SyncSummary(commit=self.commit, functions=len(self.result.functions),
                           updated=self.result.updated, removed=self.result.removed)

    def as_result(self, directory: Path) -> GitSyncResult:
        return GitSyncResult(
            repository=self.repository, ref=self.ref, commit=self.commit,
            directory=str(directory), functions=list(self.result.functions),
            updated=list(self.result.updated), removed=list(self.result.removed),
            trusted=[host.message() for host in self.trusted],
        )


class GitSyncService:
    """The ``GitSyncer`` port: ``await sync_functions()`` brings the functions directory to
    the configured source, or raises :class:`GitError` with one line."""

    def __init__(
        self, paths: GitPaths, functions_dir: Path, *, clock: Callable[[], float],
        wait_for_lock: bool = False, on_trusted: Callable[[TrustedHost], None] | None = None,
    ) -> None:
        self.paths = paths
        self.functions_dir = functions_dir
        self.store = GitStore(paths)
        self.checkout = GitCheckout(paths)
        self._clock = clock
        self._wait = wait_for_lock
        self._on_trusted = on_trusted

    async def sync_functions(self) -> GitSyncResult:
        """The ``GitSyncer`` port: :meth:`sync`, answered as plain data."""
        return (await self.sync()).as_result(self.functions_dir)

    async def sync(self) -> SyncReport:
        async with self._locked():
            source = self.store.load_source()
            if source is None:
                raise GitError("no git source configured: run `relay git set <repository>` first")
            previous = self.store.load_state()
            try:
                report = await self._run(source)
            except GitError as exc:
                self._record(previous, ok=False, error=str(exc))
                raise
            except OSError as exc:
                where = f" ({exc.filename})" if exc.filename else ""
                error = GitError(f"sync failed: {exc.strerror or exc}{where}")
                self._record(previous, ok=False, error=str(error))
                raise error from exc
            try:
                self.store.save_state(SyncState(
                    at=self._clock(), ok=True, commit=report.commit, synced_at=self._clock(),
                    repository=report.repository, functions=report.result.functions,
                ))
            except (OSError, ValueError) as exc:
                # the functions are already replaced: the sync succeeded, only its
                # record did not (`relay git status` shows the previous one)
                _log.warning("git_sync_state_not_saved", path=str(self.paths.state),
                             error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return report

    async def _run(self, source: GitSource) -> SyncReport:
        if not self.paths.private_key.is_file():
            raise GitError(
                f"no deploy key at {self.paths.private_key}: run `relay git keygen` first"
            )
        checked = await self.checkout.update(source)
        for host in checked.trusted:
            if self._on_trusted is not None:
                self._on_trusted(host)
        root = self._root(source, checked.commit)
        result = await anyio.to_thread.run_sync(replace_functions, root, self.functions_dir)
        return SyncReport(repository=source.repository, ref=source.ref, commit=checked.commit,
                          result=result, trusted=checked.trusted)

    def _root(self, source: GitSource, commit: str) -> Path:
        """``--path`` inside the checkout, resolved: a symlink anywhere on the way
        (``a`` in ``a/fns``, committed as a link to ``/etc`` or ``../..``) must not
        take the sync outside the commit it checked out."""
        checkout = self.paths.checkout.resolve()
        root = (checkout / source.path).resolve() if source.path else checkout
        left = f"in {source.ref} at commit {commit[:12]}; the functions were left as they were"
        if not root.is_relative_to(checkout):
            raise GitError(f"path {source.path!r} leads outside the checkout (through a "
                           f"symbolic link) {left}")
        if not root.is_dir():
            raise GitError(f"path {source.path!r} is not a directory {left}")
        return root

    def _record(self, previous: SyncState | None, *, ok: bool, error: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.store.save_state(SyncState(
                at=self._clock(), ok=ok, error=error,
                commit=previous.commit if previous else None,
                synced_at=previous.synced_at if previous else None,
                repository=previous.repository if previous else None,
                functions=previous.functions if previous else [],
            ))

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[None]:
        while True:
            try:
                with sync_lock(self.paths):
                    yield
                    return
            except SyncBusy:
                if not self._wait:
                    raise
            await anyio.sleep(LOCK_POLL_S)


def worker_syncer(state_dir: Path, functions_dir: Path) -> GitSyncService:
    """The worker's syncer: waits for a sync another process holds, and logs a
    newly trusted host key (the sender of ``SyncGit`` gets its line too)."""

    def trusted(host_key: TrustedHost) -> None:
        _log.warning("git_host_trusted", host=host_key.host,
                     fingerprint=host_key.fingerprint, detail=host_key.message())

    return GitSyncService(GitPaths(state_dir), functions_dir, clock=time.time,
                          wait_for_lock=True, on_trusted=trusted)


@contextlib.contextmanager
def sync_lock(paths: GitPaths) -> Iterator[None]:
    """Hold ``git/sync.lock`` (``flock``) or raise :class:`SyncBusy` at once."""
    private_dir(paths.git_dir)
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SyncBusy(
                "another git sync is running (a webhook sync or another "
                "`relay git sync`); nothing was changed, try again when it is done"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock
