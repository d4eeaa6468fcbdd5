"""The consumer and recovery loops: stream messages into the dispatcher.

Each read (``XREADGROUP``, up to the free buffer places) and each reclaim step
(``XAUTOCLAIM``) is handed to the dispatcher as ONE batch: planned, claimed in
one ledger call and settled in groups (:mod:`relay.application.dispatch`).

Both loops share one :class:`~relay.application.buffer.MessageBuffer`
(``MAX_BUFFERED_EVENTS``, in :mod:`relay.application.buffer`): a message holds a
place from the moment it is read or reclaimed until its dispatch ends
(acknowledged, dead-lettered or left pending). When the buffer is full the
consumer stops reading, so the backlog stays in the broker, not in memory.

On shutdown (:meth:`ConsumerLoop.stop_reading`, see :mod:`relay.application.
shutdown`) a loop stops taking messages at once: a wait for room or a backoff
ends there, a broker call already made is let finish and what it brings is
dispatched too (cancelling it could leave those messages pending unseen). The
loop's ``run`` then returns once every dispatch it started has ended.

Neither loop ever exits on a broker error: it logs one line when the broker
starts failing, retries with jittered backoff (1 s doubling to 30 s), and logs
one line when it answers again (:class:`ConnectionHealth`).
"""

from __future__ import annotations

import contextlib
import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence

import anyio
import anyio.lowlevel
import structlog
from anyio.abc import TaskGroup, TaskStatus

from relay.application.buffer import MessageBuffer
from relay.application.ports import EventStream
from relay.domain.errors import DependencyUnavailable
from relay.domain.events import PendingEntryDropped
from relay.domain.messages import DomainEvent
from relay.domain.outcome import StreamMessage

_log = structlog.get_logger(__name__)

# A read batch (distinct messages) to its dispatch, with what to tell as each
# message's dispatch ends (its buffer place is free again).
Done = Callable[[str], None]
Dispatch = Callable[[Sequence[StreamMessage], Done], Awaitable[object]]
Emit = Callable[[DomainEvent], None]

DEFAULT_BLOCK_MS = 1_000
RECLAIM_INTERVAL_S = 60.0
MIN_PENDING_IDLE_MS = 60_000
CALL_TIMEOUT_S = 10.0  # beyond a read's own BLOCK time, the broker counts as gone


@contextlib.contextmanager
def _answered_within(seconds: float, what: str) -> Iterator[None]:
    """A broker call that must answer within ``seconds``; a silent (frozen,
    partitioned) broker fails it with one line that says so."""
    try:
        with anyio.fail_after(seconds):
            yield
    except TimeoutError:
        raise DependencyUnavailable(
            f"the broker did not answer {what} within {seconds:g}s"
        ) from None


class Intake:
    """Whether a loop still takes new messages. :meth:`stop` ends the wait the
    loop is in (for room, a backoff, its interval) at once; a broker call is
    never made inside :meth:`waiting`, so one in progress finishes."""

    def __init__(self) -> None:
        self.stopped = False
        self._scope: anyio.CancelScope | None = None

    def stop(self) -> None:
        self.stopped = True
        if self._scope is not None:
            self._scope.cancel()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        with anyio.CancelScope() as scope:
            if self.stopped:
                scope.cancel()
            self._scope = scope
            try:
                yield
            finally:
                self._scope = None


class ConnectionHealth:
    """One log line when the broker starts failing, one when it recovers."""

    def __init__(self, name: str, *, min_s: float = 1.0, max_s: float = 30.0) -> None:
        self.name = name
        self.healthy = True
        self._min_s = min_s
        self._max_s = max_s
        self._failures = 0

    def failed(self, exc: BaseException) -> float:
        """Record a failure; returns the jittered delay before the next try."""
        if self.healthy:
            _log.warning("broker_unavailable", loop=self.name, error=str(exc))
        self.healthy = False
        self._failures += 1
        cap = min(self._max_s, self._min_s * 2 ** min(self._failures - 1, 16))
        return random.uniform(self._min_s, max(self._min_s, cap))  # noqa: S311 - jitter, not security

    def succeeded(self) -> None:
        if not self.healthy:
            _log.info("broker_recovered", loop=self.name, failures=self._failures)
        self.healthy = True
        self._failures = 0


async def _dispatch_batch(
    dispatch: Dispatch, buffer: MessageBuffer, messages: Sequence[StreamMessage]
) -> None:
    open_ids = {m.id for m in messages}

    def done(message_id: str) -> None:
        if message_id in open_ids:
            open_ids.discard(message_id)
            buffer.release(message_id)

    try:
        await dispatch(messages, done)
    except Exception:  # noqa: BLE001 - one batch's failure never stops the loop; it stays pending
        _log.exception("dispatch_failed", message_ids=[m.id for m in messages][:10])
    finally:
        # Only what the dispatch did not end: a place it freed may hold the same
        # message again by now (reclaimed), for another dispatch.
        for message_id in open_ids:
            buffer.release(message_id)


class Dispatchers:
    """Long-lived tasks that dispatch the batches a loop hands them.

    A task is started only when every existing one is busy, and then stays for
    the next batch, so there are never more than the buffer holds. Starting a
    task per batch (a cancel scope, an event and callbacks in anyio) cost more
    than a small batch's own bookkeeping.
    """

    def __init__(self, tg: TaskGroup, dispatch: Dispatch, buffer: MessageBuffer) -> None:
        self._tg = tg
        self._dispatch = dispatch
        self._buffer = buffer
        self._queue: deque[Sequence[StreamMessage]] = deque()
        self._idle: deque[anyio.Event] = deque()
        self._closed = False

    def close(self) -> None:
        """No more batches: each task ends once the queue is empty."""
        self._closed = True
        while self._idle:
            self._idle.popleft().set()

    def hand(self, messages: Sequence[StreamMessage]) -> None:
        self._queue.append(messages)
        if self._idle:
            self._idle.popleft().set()
        else:
            self._tg.start_soon(self._work)

    async def _work(self) -> None:
        while True:
            while self._queue:
                await _dispatch_batch(self._dispatch, self._buffer, self._queue.popleft())
            if self._closed:
                return
            wake = anyio.Event()
            self._idle.append(wake)
            await wake.wait()


class ConsumerLoop:
    """Reads new messages (``XREADGROUP ... >``) as fast as the buffer frees up."""

    def __init__(
        self,
        stream: EventStream,
        dispatch: Dispatch,
        buffer: MessageBuffer,
        *,
        block_ms: int = DEFAULT_BLOCK_MS,
        health: ConnectionHealth | None = None,
        call_timeout_s: float = CALL_TIMEOUT_S,
        read_max: int | None = None,
    ) -> None:
        """``read_max`` bounds a read beyond the free buffer places (the worker's
        concurrency slots: a batch larger than what can run at once only holds
        claims that wait for a slot)."""
        self._stream = stream
        self._dispatch = dispatch
        self._buffer = buffer
        self._read_max = read_max or buffer.size
        self._block_ms = block_ms
        self._call_timeout_s = call_timeout_s
        self.health = health or ConnectionHealth("consumer")
        self.intake = Intake()

    def stop_reading(self) -> None:
        """Read nothing more; ``run`` returns once what was read is dispatched."""
        self.intake.stop()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self._ensure_group()
        task_status.started()
        intake = self.intake
        async with anyio.create_task_group() as tg:
            workers = Dispatchers(tg, self._dispatch, self._buffer)
            # Read again once half the buffer is free: a read then brings several
            # messages (fewer XREADGROUPs per event under load) while the other
            # half keeps the concurrency slots busy. An idle worker reads at once.
            batch = max(1, self._buffer.size // 2)
            while not intake.stopped:
                if not self._buffer.room(batch):
                    with intake.waiting():
                        await self._buffer.wait_free(batch)
                    if intake.stopped:
                        break
                with self._buffer.reserve(min(self._buffer.free, self._read_max)) as places:
                    try:
                        # Bounded by the stream: a frozen (paused, partitioned)
                        # server never answers.
                        messages = await self._stream.read(
                            places.count, self._block_ms, self._call_timeout_s
                        )
                    except Exception as exc:  # noqa: BLE001 - never exit: back off and retry
                        backoff: float | None = self.health.failed(exc)
                    else:
                        backoff = None
                        # the whole read is one batch: planned, claimed and settled together
                        taken = [m for m in messages if places.take(m.id)]
                        if taken:
                            workers.hand(taken)
                if backoff is not None:
                    with intake.waiting():
                        await anyio.sleep(backoff)
                    continue
                self.health.succeeded()
                if places.given_back:
                    # An idle read holds every free place while it blocks: let a
                    # recovery pass waiting for room take them before reading
                    # again, or it would wait for good on a quiet stream.
                    await anyio.lowlevel.checkpoint()
            workers.close()

    async def _ensure_group(self) -> None:
        while True:
            try:
                with _answered_within(self._call_timeout_s, "the consumer group's creation"):
                    await self._stream.ensure_group()
            except Exception as exc:  # noqa: BLE001 - never exit: back off and retry
                await anyio.sleep(self.health.failed(exc))
                continue
            self.health.succeeded()
            return


class RecoveryLoop:
    """Every ``interval_s``, hands messages pending longer than ``min_idle_ms``
    back to the dispatcher (``XAUTOCLAIM``); entries whose body is gone are
    counted and dropped from the pending list, never executed."""

    def __init__(
        self,
        stream: EventStream,
        dispatch: Dispatch,
        buffer: MessageBuffer,
        *,
        emit: Emit | None = None,
        interval_s: float = RECLAIM_INTERVAL_S,
        min_idle_ms: int = MIN_PENDING_IDLE_MS,
        health: ConnectionHealth | None = None,
        call_timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        self._call_timeout_s = call_timeout_s
        self._stream = stream
        self._dispatch = dispatch
        self._buffer = buffer
        self._emit = emit
        self._interval_s = interval_s
        self._min_idle_ms = min_idle_ms
        self.health = health or ConnectionHealth("recovery")
        self.intake = Intake()

    def stop_reading(self) -> None:
        """Reclaim nothing more; ``run`` returns once what was handed over ended."""
        self.intake.stop()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        intake = self.intake
        async with anyio.create_task_group() as tg:
            while not intake.stopped:
                try:
                    await self.tick(tg)
                except Exception as exc:  # noqa: BLE001 - never exit: retry on the next tick
                    with intake.waiting():
                        await anyio.sleep(min(self.health.failed(exc), self._interval_s))
                    continue
                self.health.succeeded()
                with intake.waiting():
                    await anyio.sleep(self._interval_s)

    async def tick(self, tg: TaskGroup) -> int:
        """One whole pass over the pending list; returns how many messages it handed
        over. When the buffer is full the pass waits for room and goes on from its
        cursor: stopping there would hand back at most one buffer's worth per
        interval, and retries could fall behind for good under sustained failures."""
        handed = 0
        while True:
            with self.intake.waiting():
                await self._buffer.wait_free()
            if self.intake.stopped:
                break
            with self._buffer.reserve(self._buffer.free) as places:
                with _answered_within(self._call_timeout_s, "a reclaim of pending messages"):
                    batch = await self._stream.reclaim(self._min_idle_ms, places.count)
                taken = [m for m in batch.messages if places.take(m.id)]
                if taken:
                    handed += len(taken)
                    tg.start_soon(_dispatch_batch, self._dispatch, self._buffer, taken)
            if batch.deleted:
                await self._drop(batch.deleted)
            if batch.complete:
                break
        return handed

    async def _drop(self, ids: Sequence[str]) -> None:
        await self._stream.drop(ids)
        _log.warning("pending_entries_dropped", count=len(ids), message_ids=list(ids)[:10])
        if self._emit is not None:
            for message_id in ids:
                self._emit(PendingEntryDropped(message_id=message_id))
