"""The embedded broker's one writer thread (the file itself: :mod:`.file`).

WAL mode, ``synchronous=FULL`` (never weakened), every state change inside a
``BEGIN IMMEDIATE`` transaction. Writes are *group-committed*: each caller hands
its step to the writer thread and awaits it; the thread takes every step queued
meanwhile, runs them in one ``BEGIN IMMEDIATE`` transaction, and
answers the callers only after that transaction's ``COMMIT`` returned. A step
therefore never reports a change that is not on disk, and concurrent claims and
acknowledgments share one fsync instead of paying one each.

Several processes on one host may share the file (producers, the CLI, workers):
``BEGIN IMMEDIATE`` takes SQLite's write lock, so the begin's transaction (the
lease with the claim) is the single writer's critical section across processes
too (``busy_timeout`` waits for another process's transaction instead of failing).

Reads that need no write (a consumer's peek) run on one reading connection of
their own (:meth:`BrokerStore.peek`), so they never wait for the writer's fsync.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio

from relay.adapters.sqlite.broker.file import SCHEMA, CorruptBroker, connect, open_checked
from relay.adapters.sqlite.broker.lock import WriteLock
from relay.adapters.sqlite.broker.offers import Offers
from relay.domain.errors import DependencyUnavailable

# The file's schema and opening live in ``file``; callers have always found them here.
__all__ = ["SCHEMA", "BrokerStore", "CorruptBroker", "connect", "open_checked"]

if TYPE_CHECKING:  # a type only: the ports module pulls in the template model (pydantic)
    from relay.application.ports import Clock

T = TypeVar("T")
Step = Callable[[sqlite3.Connection, int], Any]
Undo = Callable[[sqlite3.Connection, int, Any], Any]

MAX_BATCH: Final = 512  # steps per group commit


class _Pending:
    __slots__ = ("abandoned", "future", "loop", "step", "undo", "wakes")

    def __init__(
        self,
        step: Step,
        loop: asyncio.AbstractEventLoop,
        wakes: bool,
        undo: Undo | None,
    ) -> None:
        self.step = step
        self.loop = loop
        self.wakes = wakes
        self.undo = undo
        # Set (on the caller's loop) when the caller was cancelled: the writer drops
        # an undoable step it has not taken yet (a plain flag, read under the GIL).
        self.abandoned = False
        self.future: asyncio.Future[Any] = loop.create_future()


def _consume(future: asyncio.Future[Any]) -> None:
    """No caller awaits an undo: its failure leaves the lease to recovery."""
    if not future.cancelled():
        future.exception()


class _StepFailed(Exception):
    """A step raised inside a batch (its exception is the cause)."""


class _TransactionLost(Exception):
    """SQLite rolled the batch's transaction back by itself (its cause says why)."""


def _still_open(conn: sqlite3.Connection, error: BaseException | None) -> None:
    """On ``SQLITE_FULL``, an I/O error or ``SQLITE_NOMEM`` SQLite may roll the whole
    transaction back by itself, and every later statement would then run in
    autocommit: part of a batch on disk while its callers are told it failed.
    Checked after every step (and after one that raised), so the writer stops at
    once and fails every caller of the batch instead (row 170)."""
    if not conn.in_transaction:
        raise _TransactionLost from error


class Batch:
    """The transaction being built (writer thread only): what a step changed
    outside the database that must wait for the transaction's end (its
    ``COMMIT`` or its rollback), such as a begun job's offer, which must not be
    withdrawn before its lease is visible to the other readers."""

    def __init__(self) -> None:
        self._at_end: list[Callable[[], None]] = []

    def at_end(self, then: Callable[[], None]) -> None:
        self._at_end.append(then)

    def ended(self) -> None:
        for then in self._at_end:
            then()


class BrokerStore:
    """The open broker file and its writer thread (group commit)."""

    def __init__(self, path: Path, clock: Clock) -> None:
        self.path = path
        self.clock = clock
        self._conn = open_checked(path)
        self._lock = WriteLock(self._conn)  # BEGIN IMMEDIATE, fair between processes
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="relay-broker-writer", daemon=True)
        self._closed = False
        self._closing = threading.Lock()
        self.commits = 0  # transactions committed (diagnostic: steps / commits = batch size)
        self.steps = 0
        self.offers = Offers()  # jobs peeked and not begun yet
        self._reader: sqlite3.Connection | None = None  # reads only (see peek)
        self._reading = threading.Lock()
        self._wakers: set[asyncio.Event] = set()
        self.batch = Batch()  # the transaction being built (writer thread only)
        self._thread.start()

    def now_ms(self) -> int:
        return int(self.clock.now() * 1000)

    async def write(
        self,
        step: Callable[[sqlite3.Connection, int], T],
        *,
        wakes: bool = False,
        undo: Callable[[sqlite3.Connection, int, T], Any] | None = None,
    ) -> T:
        """Run ``step(conn, now_ms)`` inside the next group commit; its result once
        committed. ``wakes``: the step makes jobs ready (readers blocked here look
        again).

        A step once queued runs to its end (and commits) even if its caller is
        cancelled meanwhile; the cancelled caller just never hears of it (so a
        handler's result is never dropped on its way to the ledger). A step given
        an ``undo`` is one that may be taken back instead (a claim): cancelled
        while still queued, it never runs; already run, ``undo(conn, now_ms,
        result)`` runs in a later transaction of its own (the claim gives its
        leases back, so no job stays leased to a reader that is gone)."""
        pending = _Pending(step, asyncio.get_running_loop(), wakes, undo)
        self._put(pending)
        try:
            result: T = await pending.future
        except asyncio.CancelledError:
            self._abandon(pending)
            raise
        return result

    def _put(self, pending: _Pending) -> None:
        with self._closing:  # never behind the writer's stop mark: it would hang
            if self._closed:
                raise DependencyUnavailable("sqlite broker is closed")
            self._queue.put(pending)

    def _abandon(self, pending: _Pending) -> None:
        """The caller was cancelled (on its loop). Either the writer has not
        answered yet (it drops an undoable step it has not taken, runs any other
        to its end, and :meth:`_settle_all` undoes what it ran), or the answer
        came before the cancellation: undo it here."""
        pending.abandoned = True
        future = pending.future
        if future.done() and not future.cancelled() and future.exception() is None:
            self._undo(pending, future.result())

    def _undo(self, pending: _Pending, result: Any) -> None:
        undo = pending.undo
        if undo is None:
            return

        def step(conn: sqlite3.Connection, now_ms: int) -> Any:
            return undo(conn, now_ms, result)

        again = _Pending(step, pending.loop, True, None)
        again.future.add_done_callback(_consume)
        # Closed: the leases stay until this worker's restart releases them (row 73).
        with contextlib.suppress(DependencyUnavailable):
            self._put(again)

    async def read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """A read-only query on a connection of its own, in a worker thread."""

        def run() -> T:
            conn = connect(self.path)
            try:
                return query(conn)
            except sqlite3.Error as exc:
                raise DependencyUnavailable(f"sqlite broker read failed: {exc}") from exc
            finally:
                conn.close()

        return await anyio.to_thread.run_sync(run)

    async def peek(self, query: Callable[[sqlite3.Connection, int], T]) -> T:
        """``query(conn, now_ms)`` on this process's one reading connection, in a
        worker thread: a read never waits for the writer's batch (its fsync), and
        sees only committed transactions (WAL: a snapshot per statement)."""

        def run() -> T:
            with self._reading:
                if self._closed:
                    raise DependencyUnavailable("sqlite broker is closed")
                if self._reader is None:
                    self._reader = connect(self.path)
                try:
                    return query(self._reader, self.now_ms())
                except sqlite3.Error as exc:
                    raise DependencyUnavailable(f"sqlite broker read failed: {exc}") from exc

        return await anyio.to_thread.run_sync(run)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            # A step that may be undone may also be dropped once its caller is gone;
            # every other step runs to its end (a ledger call's promise).
            batch = [p for p in batch if not (p.abandoned and p.undo is not None)]
            if batch:
                self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[_Pending]) -> None:
        """The whole batch in one transaction; if any step raises, the transaction
        is rolled back and each step runs again in a transaction of its own, so one
        failing step is its caller's alone (steps are functions of the database,
        so running one again after a rollback is running it for the first time)."""
        try:
            outcomes = self._transaction(batch)
        except _TransactionLost as lost:
            failed = DependencyUnavailable(f"sqlite broker write failed: {lost.__cause__ or lost}")
            outcomes = [(None, failed) for _ in batch]
        except _StepFailed:
            outcomes = [self._alone(pending) for pending in batch]
        except sqlite3.Error as exc:
            failed = DependencyUnavailable(f"sqlite broker write failed: {exc}")
            outcomes = [(None, failed) for _ in batch]
        self._answer(batch, outcomes)
        self._wake(batch)

    def _transaction(self, batch: list[_Pending]) -> list[tuple[Any, BaseException | None]]:
        conn = self._conn
        self._lock.begin()
        try:
            now_ms = self.now_ms()
            self.batch = Batch()
            results: list[tuple[Any, BaseException | None]] = []
            for pending in batch:
                try:
                    results.append((pending.step(conn, now_ms), None))
                except Exception as exc:
                    _still_open(conn, exc)
                    raise _StepFailed from exc
                _still_open(conn, None)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            self.batch.ended()
        self.commits += 1
        self.steps += len(batch)
        return results

    def _alone(self, pending: _Pending) -> tuple[Any, BaseException | None]:
        try:
            return self._transaction([pending])[0]
        except _TransactionLost as lost:
            return None, DependencyUnavailable(f"sqlite broker write failed: {lost.__cause__}")
        except _StepFailed as failed:
            exc = failed.__cause__
            assert isinstance(exc, Exception)
            if isinstance(exc, sqlite3.Error):
                return None, DependencyUnavailable(f"sqlite broker step failed: {exc}")
            return None, exc
        except sqlite3.Error as exc:
            return None, DependencyUnavailable(f"sqlite broker write failed: {exc}")

    def _answer(
        self, batch: list[_Pending], outcomes: list[tuple[Any, BaseException | None]]
    ) -> None:
        """One wake-up per event loop for the whole batch, not one per step: each
        ``call_soon_threadsafe`` writes to the loop's self-pipe."""
        answers = [(p, r, e) for p, (r, e) in zip(batch, outcomes, strict=True)]
        loop = batch[0].loop
        if all(p.loop is loop for p in batch):  # one event loop: the common case
            by_loop = {loop: answers}
        else:
            by_loop = {}
            for answer in answers:
                by_loop.setdefault(answer[0].loop, []).append(answer)
        for target, group in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed (shutdown)
                target.call_soon_threadsafe(self._settle_all, group)

    def _settle_all(self, answers: list[tuple[_Pending, Any, BaseException | None]]) -> None:
        """On the callers' loop. A caller cancelled while its committed step was
        in flight never hears of it: its step is undone instead."""
        for pending, result, error in answers:
            future = pending.future
            if not future.done():
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)
            elif error is None:
                self._undo(pending, result)

    # --- waking blocked readers in this process ------------------------------------
    def waker(self) -> asyncio.Event:
        """An event set whenever a committed batch made jobs ready (one per reader)."""
        event = asyncio.Event()
        self._wakers.add(event)
        return event

    def _wake(self, batch: list[_Pending]) -> None:
        waking = [p for p in batch if p.wakes]
        if not waking:
            return
        for event in list(self._wakers):
            try:
                waking[0].loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed
                self._wakers.discard(event)

    def close(self) -> None:
        with self._closing:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout=30)
        self._conn.close()
        with self._reading:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
