"""Relay's own CPU per handled event, without Redis or Docker.

    .venv/bin/python bench/dispatch_cpu.py [--events 40000] [--rounds 5]

The worker's consumer loop, buffer, command bus, dispatcher, concurrency slots
and metrics subscribers, exactly as ``relay start`` wires them, fed by a stream
stand-in that always has messages ready, with a ledger stand-in that answers
at once (one claim, then acknowledged) and a runtime stand-in that answers
``ok`` after one scheduler turn. What is left is what Relay's application
layer costs per event, the part no I/O library is responsible for.

Prints CPU microseconds per event (``time.process_time``) for each round and
their median, next to a baseline measured in the same run: the same number of
bare asyncio tasks that each await the two stand-in ledger calls and the
stand-in invocation, with nothing else (what the stand-ins themselves cost).
Runs under uvloop when it is installed, like the worker.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from relay.adapters.metrics.registry import Metrics
from relay.adapters.metrics.subscribers import subscribe
from relay.adapters.system import RandomTokenSource, SystemClock
from relay.application.buffer import MessageBuffer
from relay.application.bus import MessageBus
from relay.application.concurrency import Slots
from relay.application.consumer import ConsumerLoop
from relay.application.delivery_log import subscribe_delivery_log
from relay.application.dispatch import MessageDispatcher
from relay.application.registry import ActiveFunction, FunctionRegistry
from relay.domain.commands import DispatchBatch
from relay.domain.execution import InvocationRequest, InvocationResult
from relay.domain.invocation import invocation_field
from relay.domain.outcome import (
    CLAIMED,
    BeginRequest,
    BeginResult,
    ClaimRequest,
    ClaimStatus,
    FinishRequest,
    MalformedRequest,
    MessageContext,
    Reclaimed,
    RenewRequest,
    Settlement,
    StreamMessage,
)
from relay.domain.template import parse_template
from relay.entrypoints.daemon import loop_options
from relay.entrypoints.logging import configure_logging

FUNCTION = "bench"
HANDLER = "main.handler"
PAYLOAD = b'{"type": "bench", "n": 1}'
BUFFER = 16
CONCURRENCY = 4


class ReadyStream:
    """Always has ``count`` messages for a read, until ``total`` were handed out."""

    stream, group, consumer = "bench", "relay", "bench-host"

    def __init__(self, total: int) -> None:
        self.total = total
        self.handed = 0
        self.done = anyio.Event()
        self.acked = 0

    async def ensure_group(self) -> None:
        return None

    async def read(
        self, count: int, block_ms: int, patience_s: float = 10.0
    ) -> Sequence[StreamMessage]:
        await anyio.lowlevel.checkpoint()
        n = min(count, self.total - self.handed)
        if n <= 0:
            await self.done.wait()
            return ()
        first = self.handed
        self.handed += n
        return [StreamMessage(id=f"{first + i}-0", payload=PAYLOAD) for i in range(n)]

    async def reclaim(self, min_idle_ms: int, count: int) -> Reclaimed:
        return Reclaimed(messages=(), deleted=(), complete=True)

    async def drop(self, ids: Sequence[str]) -> None:
        return None


def _claimed(request: BeginRequest) -> BeginResult:
    statuses = tuple(
        ClaimStatus(field=c.field, status=CLAIMED, attempt=1, until_ms=0, previous="")
        for c in request.claims
    )
    return BeginResult(newly_classified=True, statuses=statuses)


class AnsweringLedger:
    """Claims every requested invocation as attempt 1; every finish acknowledges."""

    def __init__(self, stream: ReadyStream) -> None:
        self._stream = stream

    async def begin(self, request: BeginRequest) -> BeginResult:
        await anyio.lowlevel.checkpoint()
        statuses = tuple(
            ClaimStatus(field=c.field, status=CLAIMED, attempt=1, until_ms=0, previous="")
            for c in request.claims
        )
        return BeginResult(newly_classified=True, statuses=statuses)

    async def finish(self, request: FinishRequest) -> Settlement:
        await anyio.lowlevel.checkpoint()
        self._stream.acked += 1
        if self._stream.acked == self._stream.total:
            self._stream.done.set()
        return Settlement(acknowledged=True)

    async def begin_many(self, requests: Sequence[BeginRequest]) -> list[BeginResult]:
        await anyio.lowlevel.checkpoint()  # one call for the batch, as the scripts are
        return [_claimed(request) for request in requests]

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[Settlement]:
        await anyio.lowlevel.checkpoint()
        self._stream.acked += len(requests)
        if self._stream.acked == self._stream.total:
            self._stream.done.set()
        return [Settlement(acknowledged=True)] * len(requests)

    async def dead_letter_malformed(self, request: MalformedRequest) -> Settlement:
        raise AssertionError("no malformed events in this bench")

    async def renew(self, request: RenewRequest) -> int:
        raise AssertionError("every lease covers its handler in this bench")


class AnsweringRuntime:
    async def invoke(
        self, request: InvocationRequest, *, guard: Any = None
    ) -> InvocationResult:
        if guard is not None:
            await guard()  # the lease check the real runtime makes before a request
        await anyio.lowlevel.checkpoint()
        return InvocationResult(ok=True, duration_s=0.001)


class NoSecrets:
    def get(self, name: str) -> str | None:
        return None


def registry() -> FunctionRegistry:
    template = parse_template(
        {
            "runtime": "python3.14",
            "events": [{"handler": HANDLER, "pattern": {"type": ["bench"]}}],
        }
    )
    functions = FunctionRegistry()
    functions.put(
        ActiveFunction(
            name=FUNCTION,
            directory="/functions/bench",
            template=template,
            runtime="python3.14",
            image="bench:1",
            fingerprint=None,
            prepared_at=None,
        )
    )
    return functions


async def relay_round(events: int) -> float:
    """CPU us per event through the consumer loop, bus and dispatcher."""
    stream = ReadyStream(events)
    slots = Slots(CONCURRENCY)
    slots.resize(FUNCTION, CONCURRENCY)
    bus = MessageBus({})
    # As bootstrap wires it: every domain event reaches the metrics and the
    # delivery log through the bus's notify, as it happens.
    dispatcher = MessageDispatcher(
        stream=stream,
        ledger=AnsweringLedger(stream),
        registry=registry(),
        runtime=AnsweringRuntime(),
        slots=slots,
        secrets=NoSecrets(),
        clock=SystemClock(),
        tokens=RandomTokenSource(),
        max_event_bytes=256 * 1024,
        notify=bus.emit,
    )
    bus.register(DispatchBatch, dispatcher.handle_batch)
    subscribe_delivery_log(bus)
    subscribe(bus, Metrics())

    async def dispatch(messages: Sequence[StreamMessage], done: Callable[[str], None]) -> None:
        await bus.send(DispatchBatch(messages=tuple(messages), done=done))

    loop = ConsumerLoop(stream, dispatch, MessageBuffer(BUFFER))
    began = time.process_time()
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        await stream.done.wait()
        tg.cancel_scope.cancel()
    return (time.process_time() - began) / events * 1e6


async def baseline_round(events: int) -> float:
    """CPU us per event of the stand-ins alone: bare tasks, same concurrency."""
    stream = ReadyStream(events)
    ledger, runtime = AnsweringLedger(stream), AnsweringRuntime()
    field = invocation_field(FUNCTION, HANDLER)
    ctx = MessageContext(stream="b", group="g", consumer="c", message_id="1-0", timestamp="t")
    claim = ClaimRequest(field=field, max_attempts=5, lease_ms=1000)
    begin = BeginRequest(
        context=ctx, classification="matched", token="t", claims=(claim,), gates=(field,)
    )
    finish = FinishRequest(context=ctx, token="t", reports=(), gates=(field,))
    invocation = InvocationRequest(function=FUNCTION, handler=HANDLER, event=PAYLOAD)
    places = anyio.Semaphore(BUFFER)

    async def one(message: StreamMessage) -> None:
        try:
            begun = await ledger.begin(begin)
            assert begun.statuses
            await runtime.invoke(invocation)
            await ledger.finish(finish)
        finally:
            places.release()

    began = time.process_time()
    async with anyio.create_task_group() as tg:
        while stream.handed < events:
            await places.acquire()
            for message in await stream.read(1, 0):
                tg.start_soon(one, message)
        await stream.done.wait()
    return (time.process_time() - began) / events * 1e6


async def main(args: argparse.Namespace) -> None:
    relay: list[float] = []
    base: list[float] = []
    for n in range(args.rounds + 1):
        r = await relay_round(args.events)
        b = await baseline_round(args.events)
        if n == 0:
            continue  # warm-up: imports, first allocations
        relay.append(r)
        base.append(b)
        print(f"round {n}: relay {r:6.1f} us/event   stand-ins alone {b:5.1f} us/event", flush=True)
    r, b = statistics.median(relay), statistics.median(base)
    print(f"median : relay {r:6.1f} us/event   stand-ins alone {b:5.1f}   relay's own {r - b:6.1f}")


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    configure_logging("WARN")  # as the throughput benches run the worker
    anyio.run(main, args, backend_options=loop_options())


if __name__ == "__main__":
    run()
