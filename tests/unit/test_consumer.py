"""Consumer and recovery loops on fakes: the buffer bound, reclaim, dropped entries, outages."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs

from relay.application.buffer import MessageBuffer
from relay.application.consumer import (
    ConnectionHealth,
    ConsumerLoop,
    RecoveryLoop,
    _dispatch_batch,
)
from relay.domain import events as ev
from relay.domain.messages import DomainEvent
from relay.domain.outcome import StreamMessage
from tests.fakes import FakeClock, InMemoryEventStream, one_by_one

pytestmark = pytest.mark.anyio


class SlowDispatch:
    """Holds every message until released; records the peak number held."""

    def __init__(self, buffer: MessageBuffer) -> None:
        self.buffer = buffer
        self.seen: list[str] = []
        self.peak = 0
        self.gate = anyio.Event()

    async def __call__(self, message: StreamMessage) -> None:
        self.seen.append(message.id)
        self.peak = max(self.peak, self.buffer.occupancy)
        await self.gate.wait()


async def wait_for(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` with a deadline (the fakes expose plain attributes, no events)."""
    with anyio.fail_after(5):
        while not condition():  # noqa: ASYNC110 - polling a fake's plain attribute
            await anyio.sleep(0.001)


def stream_with_events(count: int) -> InMemoryEventStream:
    """A fake stream holding ``count`` small, distinct events."""
    stream = InMemoryEventStream(FakeClock())
    for i in range(count):
        stream.add(b'{"n": %d}' % i)
    return stream


async def test_the_buffer_bounds_what_is_read() -> None:
    stream = stream_with_events(10)
    buffer = MessageBuffer(3)
    dispatch = SlowDispatch(buffer)
    loop = ConsumerLoop(stream, one_by_one(dispatch), buffer, block_ms=1)
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        await wait_for(lambda: len(dispatch.seen) == 3)
        await anyio.sleep(0.02)  # a sustained window: nothing more is read while full
        assert len(dispatch.seen) == 3
        assert len(stream.pending) == 3  # the backlog stays in the broker
        dispatch.gate.set()
        await wait_for(lambda: len(dispatch.seen) == 10)
        tg.cancel_scope.cancel()
    assert dispatch.peak <= 3
    assert buffer.occupancy == 0


class GatedDispatch:
    """Holds each message until that message is released."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.gates: dict[str, anyio.Event] = {}

    async def __call__(self, message: StreamMessage) -> None:
        self.seen.append(message.id)
        gate = self.gates[message.id] = anyio.Event()
        await gate.wait()

    def release(self, count: int) -> None:
        waiting = [i for i in self.seen if not self.gates[i].is_set()]
        for message_id in waiting[:count]:
            self.gates[message_id].set()


async def test_a_busy_worker_reads_again_once_half_the_buffer_is_free() -> None:
    stream = stream_with_events(20)
    buffer = MessageBuffer(8)
    dispatch = GatedDispatch()
    loop = ConsumerLoop(stream, one_by_one(dispatch), buffer, block_ms=1)
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        await wait_for(lambda: len(dispatch.seen) == 8)  # an idle worker fills up at once
        dispatch.release(3)
        await wait_for(lambda: buffer.occupancy == 5)
        await anyio.sleep(0.02)  # a sustained window: 3 free places are not enough
        assert len(dispatch.seen) == 8
        dispatch.release(1)
        await wait_for(lambda: len(dispatch.seen) == 12)  # half free: one read of 4
        await anyio.sleep(0.02)
        assert len(dispatch.seen) == 12
        tg.cancel_scope.cancel()


async def test_reads_recover_after_an_outage_with_one_line_each_way() -> None:
    clock = FakeClock()
    stream = InMemoryEventStream(clock)
    stream.fail_reads = 3
    stream.add(b"{}")
    buffer = MessageBuffer(4)
    seen: list[str] = []

    async def dispatch(message: StreamMessage) -> None:
        seen.append(message.id)

    health = ConnectionHealth("consumer", min_s=0.001, max_s=0.002)
    loop = ConsumerLoop(stream, one_by_one(dispatch), buffer, block_ms=1, health=health)
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(loop.run)
            await wait_for(lambda: len(seen) == 1)
            tg.cancel_scope.cancel()
    names = [entry["event"] for entry in logs]
    assert names.count("broker_unavailable") == 1
    assert names.count("broker_recovered") == 1
    assert health.healthy


async def test_a_silent_broker_is_reported_by_recovery_in_one_clear_line() -> None:
    stream = stream_with_events(0)
    stream.silent_reclaims = 1

    async def dispatch(message: StreamMessage) -> None:
        return None

    health = ConnectionHealth("recovery", min_s=0.001, max_s=0.002)
    loop = RecoveryLoop(
        stream,
        one_by_one(dispatch),
        MessageBuffer(4),
        interval_s=0.001,
        health=health,
        call_timeout_s=0.01,
    )
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(loop.run)
            await wait_for(lambda: any(e["event"] == "broker_recovered" for e in logs))
            tg.cancel_scope.cancel()
    [down] = [e for e in logs if e["event"] == "broker_unavailable"]
    assert down["error"] == "the broker did not answer a reclaim of pending messages within 0.01s"


async def test_recovery_hands_idle_messages_back_and_drops_deleted_ones() -> None:
    clock = FakeClock()
    stream = InMemoryEventStream(clock)
    kept = stream.add(b"{}")
    gone = stream.add(b"{}")
    fresh_id = stream.add(b"{}")
    await stream.read(2, 0)
    stream.delete(gone)
    clock.advance(61)
    await stream.read(1, 0)  # delivered just now: not idle yet
    buffer = MessageBuffer(8)
    seen: list[StreamMessage] = []
    published: list[DomainEvent] = []

    async def dispatch(message: StreamMessage) -> None:
        seen.append(message)

    loop = RecoveryLoop(
        stream, one_by_one(dispatch), buffer, emit=published.append, interval_s=0.01
    )
    async with anyio.create_task_group() as tg:
        handed = await loop.tick(tg)
    assert handed == 1
    assert [(m.id, m.reclaimed, m.deliveries) for m in seen] == [(kept, True, 2)]
    assert gone not in stream.pending
    assert stream.dropped == [gone]
    assert published == [ev.PendingEntryDropped(message_id=gone)]
    assert fresh_id in stream.pending


async def test_recovery_skips_messages_already_held_locally() -> None:
    clock = FakeClock()
    stream = InMemoryEventStream(clock)
    busy = stream.add(b"{}")
    await stream.read(1, 0)
    clock.advance(61)
    buffer = MessageBuffer(4)
    assert buffer.take(busy)  # still being processed by this worker
    seen: list[str] = []

    async def dispatch(message: StreamMessage) -> None:
        seen.append(message.id)

    loop = RecoveryLoop(stream, one_by_one(dispatch), buffer)
    async with anyio.create_task_group() as tg:
        assert await loop.tick(tg) == 0
    assert seen == []


def test_backoff_is_jittered_between_one_and_thirty_seconds() -> None:
    health = ConnectionHealth("x")
    delays = [health.failed(RuntimeError("down")) for _ in range(12)]
    assert all(1.0 <= d <= 30.0 for d in delays)
    assert max(delays[6:]) > 2.0


async def test_one_recovery_pass_hands_back_more_than_a_buffer_full() -> None:
    """40 idle messages and a buffer of 4: one pass reaches them all, waiting for
    room between steps, instead of one buffer's worth per interval."""
    clock = FakeClock()
    stream = InMemoryEventStream(clock)
    ids = [stream.add(b"{}") for _ in range(40)]
    await stream.read(40, 0)
    clock.advance(61)
    buffer = MessageBuffer(4)
    seen: list[str] = []

    async def dispatch(message: StreamMessage) -> None:
        seen.append(message.id)
        await anyio.lowlevel.checkpoint()

    loop = RecoveryLoop(stream, one_by_one(dispatch), buffer, interval_s=3600)
    async with anyio.create_task_group() as tg:
        handed = await loop.tick(tg)
    assert handed == 40
    assert sorted(seen) == sorted(ids)
    assert buffer.occupancy == 0


async def test_messages_are_dispatched_by_at_most_one_task_per_buffer_place() -> None:
    stream = stream_with_events(60)
    buffer = MessageBuffer(4)
    seen: list[str] = []
    tasks: set[int] = set()

    async def dispatch(messages: Sequence[StreamMessage], done: Callable[[str], None]) -> None:
        tasks.add(anyio.get_current_task().id)
        await anyio.lowlevel.checkpoint()
        for message in messages:
            seen.append(message.id)
            done(message.id)

    loop = ConsumerLoop(stream, dispatch, buffer, block_ms=1)
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        await wait_for(lambda: len(seen) == 60)
        tg.cancel_scope.cancel()
    assert sorted(seen) == sorted(stream.entries)  # each message once
    assert len(tasks) <= 4  # the dispatching tasks are reused, not one per batch
    assert buffer.occupancy == 0


class HeldReads(InMemoryEventStream):
    """A stream whose next read waits at the broker until ``answer`` is set."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.reading = anyio.Event()
        self.answer = anyio.Event()
        self.counts: list[int] = []

    async def read(
        self, count: int, block_ms: int, patience_s: float = 10.0
    ) -> list[StreamMessage]:
        self.counts.append(count)
        if not self.answer.is_set():
            self.reading.set()
            await self.answer.wait()
        return await super().read(count, block_ms, patience_s)


async def test_messages_read_while_recovery_filled_the_buffer_are_all_dispatched() -> None:
    """The consumer asks for 4 with 4 free places; while the read waits at the
    broker, a recovery pass finds 2 idle messages. Every message the read then
    brings must be dispatched, none left pending for the next reclaim."""
    clock = FakeClock()
    stream = HeldReads(clock)
    stream.answer.set()
    idle = [stream.add(b"{}") for _ in range(2)]
    await stream.read(2, 0)  # delivered long ago, never acknowledged
    clock.advance(61)
    fresh = [stream.add(b"{}") for _ in range(4)]
    stream.answer = anyio.Event()
    buffer = MessageBuffer(4)
    dispatch = GatedDispatch()
    consumer = ConsumerLoop(stream, one_by_one(dispatch), buffer, block_ms=1)
    recovery = RecoveryLoop(stream, one_by_one(dispatch), buffer, interval_s=3600)
    async with anyio.create_task_group() as tg:
        await tg.start(consumer.run)
        await stream.reading.wait()  # the read of 4 is at the broker
        tg.start_soon(recovery.tick, tg)
        await wait_for(lambda: buffer.free == 0 or len(dispatch.seen) == 2)
        stream.answer.set()
        with anyio.move_on_after(2):  # polls until all six ran, or gives up
            while len(dispatch.seen) < 6 or buffer.occupancy:
                dispatch.release(6)
                await anyio.sleep(0.001)
        tg.cancel_scope.cancel()
    assert stream.counts[1] == 4
    assert sorted(dispatch.seen) == sorted(idle + fresh)  # each once, none skipped
    assert buffer.free == 4


async def test_recovery_gets_places_while_the_consumer_idles_on_a_quiet_stream() -> None:
    """Each idle read reserves every free place while it blocks; between two reads
    a waiting recovery pass must still get them."""
    clock = FakeClock()
    stream = InMemoryEventStream(clock)
    idle = [stream.add(b"{}") for _ in range(2)]
    await stream.read(2, 0)
    clock.advance(61)
    buffer = MessageBuffer(4)
    seen: list[str] = []

    async def dispatch(message: StreamMessage) -> None:
        seen.append(message.id)

    consumer = ConsumerLoop(stream, one_by_one(dispatch), buffer, block_ms=1)
    recovery = RecoveryLoop(stream, one_by_one(dispatch), buffer, interval_s=3600)
    async with anyio.create_task_group() as tg:
        await tg.start(consumer.run)
        await wait_for(lambda: stream.reads >= 3)  # the consumer idles, reading nothing
        with anyio.fail_after(5):
            assert await recovery.tick(tg) == 2
        await wait_for(lambda: len(seen) == 2)
        tg.cancel_scope.cancel()
    assert sorted(seen) == sorted(idle)


async def test_a_place_a_batch_freed_and_that_was_taken_again_stays_held() -> None:
    """A batch ends each message's place as its dispatch ends; the recovery loop
    may hold the same message again meanwhile (reclaimed), and the batch's own end
    must not free that new holding."""
    buffer = MessageBuffer(4)
    first, second = StreamMessage(id="1-0", payload=b"{}"), StreamMessage(id="2-0", payload=b"{}")
    with buffer.reserve(2) as places:
        assert places.take(first.id)
        assert places.take(second.id)

    async def dispatch(messages: Sequence[StreamMessage], done: Callable[[str], None]) -> None:
        done(first.id)
        assert buffer.take(first.id)  # reclaimed and held again, for another dispatch
        raise RuntimeError("the rest of the batch failed")

    with capture_logs():
        await _dispatch_batch(dispatch, buffer, [first, second])
    assert buffer.occupancy == 1  # the new holding of the first; the second is freed
    assert not buffer.take(first.id)
