"""The adapters-only consumer of ``bench/throughput.py``: Relay's external work per
event with as little Python between as possible.

Per message it makes exactly the calls a handled event costs Relay (XREADGROUP in
batches, the ledger's ``begin`` script, one request to a warm execution container,
the ``finish`` script that XACKs), through Relay's own adapters
(``RedisEventStream``, ``RedisInvocationLedger``, ``DockerContainerRuntime``), but
with no dispatcher, matching, bus, metrics, concurrency slots or recovery loop. Its
rate is the ceiling the application layer is measured against: the distance
between it and Relay end to end is what Relay's own Python costs.

Run as ``python bench/_floor.py URL STREAM GROUP IMAGE CONTAINERS``.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import tempfile
from pathlib import Path

import aiodocker
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _redisbench import run_consumer

from relay.adapters.docker.runtime import DockerContainerRuntime
from relay.adapters.redis.ledger import RedisInvocationLedger
from relay.adapters.redis.stream import RedisEventStream
from relay.domain.execution import InvocationRequest
from relay.domain.invocation import Complete, invocation_field
from relay.domain.outcome import (
    AttemptReport,
    BeginRequest,
    ClaimRequest,
    FinishRequest,
    MessageContext,
    StreamMessage,
)
from relay.entrypoints.logging import configure_logging

FUNCTION, HANDLER = "bench", "bench.noop"
FIELD = invocation_field(FUNCTION, HANDLER)
BUFFER = 16


async def consume(url: str, stream: str, group: str, image: str, containers: int) -> None:
    client = Redis.from_url(url)
    events = RedisEventStream(client, stream=stream, group=group, consumer="floor")
    ledger = RedisInvocationLedger(client)
    queue: asyncio.Queue[StreamMessage] = asyncio.Queue(BUFFER)
    claims = (ClaimRequest(field=FIELD, max_attempts=5, lease_ms=15_000),)

    async def handle(runtime: DockerContainerRuntime) -> None:
        while True:
            message = await queue.get()
            ctx = MessageContext(
                stream=stream,
                group=group,
                consumer="floor",
                message_id=message.id,
                timestamp="2026-01-01T00:00:00Z",
            )
            token = secrets.token_hex(16)
            started = await ledger.begin(
                BeginRequest(
                    context=ctx,
                    classification="matched:bench",
                    token=token,
                    claims=claims,
                    gates=(FIELD,),
                )
            )
            attempt = started.statuses[0].attempt
            await runtime.invoke(
                InvocationRequest(
                    function=FUNCTION,
                    handler=HANDLER,
                    event=message.payload or b"{}",
                    context=message.id,
                )
            )
            report = AttemptReport(field=FIELD, attempt=attempt, transition=Complete())
            await ledger.finish(
                FinishRequest(context=ctx, token=token, reports=(report,), gates=(FIELD,))
            )

    await events.ensure_group()
    # Relay's socket in each container, as the worker makes them with a local engine
    direct_dir = Path(tempfile.mkdtemp(prefix="relay-floor-")) / "containers"
    async with (
        aiodocker.Docker() as docker,
        DockerContainerRuntime(
            docker, hostname="bench-floor", output=lambda _: None, direct_dir=direct_dir
        ) as runtime,
    ):
        runtime.activate(FUNCTION, image, "python3.14", containers)
        tasks = [asyncio.ensure_future(handle(runtime)) for _ in range(containers * 2)]
        while True:
            for message in await events.read(BUFFER - queue.qsize() or 1, 1000):
                await queue.put(message)
            if any(task.done() for task in tasks):
                for task in tasks:
                    if task.done():
                        task.result()  # raise what ended it


def main() -> None:
    configure_logging("WARN")  # as the bench's worker runs
    run_consumer(consume)


if __name__ == "__main__":
    main()
