"""Soak: two workers, one SIGKILLed three times, a handler that fails 10% of the time.

    .venv/bin/python bench/soak.py [--events 5000] [--rate 100] [--redis-url URL]
                                   [--variant kill|now|broken-template|mid-batch]
                                   [--broker redis|sqlite]

``--broker sqlite`` runs the same soak on the embedded broker: both workers share
one broker file (``RELAY_BROKER=sqlite``, ``RELAY_BROKER_PATH``), events go in
through Relay's ``SqliteEventPublisher`` (a burst: one transaction), the DLQ is
read through ``SqliteDeadLetterReader``, the ledgers and "pending" (jobs not
acknowledged) from the file; the throwaway Redis then only takes the handler's
marks. The mid-batch kill counts b's leases taken (or renewed) in the last 2 s
that are not acknowledged, where Redis counts b's pending entries delivered then.

Variants (all must print lost = 0):

* ``kill`` (the default): as below.
* ``now``: the rule also requires ``at: {gt: "now()-30s"}`` and each event carries
  the time it was produced, so a failed attempt's redelivery (after its 1 m
  backoff) no longer matches; the recorded invocation must still run again.
* ``mid-batch``: events are produced in bursts of 8 (one MULTI/EXEC each, so a
  worker's read takes a burst as one batch) and every fourth one sleeps 1 s
  instead of 10 ms; each SIGKILL of b waits until b holds a batch half settled
  (of the entries pending to consumer ``soak-b`` that it took in the last 2 s,
  some were just acknowledged and some are not). Besides lost = 0, its
  duplicate DLQ entries must be 0.
* ``broken-template``: worker b has its own copy of the functions directory;
  once, it is killed and restarted with its template broken (it cannot load the
  function), and the template is repaired 20 s later. Messages b holds meanwhile
  must neither be acknowledged nor lost.

Starts a throwaway Redis container (relay-testbed/redis:7, label relay.test=true)
and two real ``relay start`` workers on one stream and group. A Python handler
writes a ``start`` and an ``end`` mark (with the outcome) for every execution to a
Redis list over a raw socket (stdlib only, so the function needs no
dependencies), sleeps 10 ms and fails 10% of the time; its rule has
``retries: 1`` so an unlucky event is dead-lettered within minutes rather than
the default 18. While events are produced at ``--rate``/s, worker B is killed
with SIGKILL three times and restarted. When the group has nothing pending the
script prints:

* lost: events with neither a successful execution nor a DLQ entry (want 0);
* concurrent duplicates: two executions of one event whose start..end overlap
  (want 0); sequential re-runs are expected (at-least-once) and shown apart;
* DLQ entries next to the exhausted invocations the ledger recorded (want
  equal) and duplicate DLQ entries (want 0);
* events that never succeeded, and DLQ entries of events that did succeed once:
  a run that ended just before its worker was killed, so the ledger never
  heard of its success; the re-run that followed counted as the next attempt,
  and when that one was the last and failed, the invocation was exhausted
  (at-least-once: the handler's effects happened, the DLQ entry says the
  ledger's attempts were used up). Each is shown with how long before a kill
  its successful run ended;
* pending at the end (want 0).

Settling takes a few minutes: a failed attempt waits out its 1 m backoff and
runs again at the next recovery pass (each worker makes one a minute, over its
whole pending list), and a killed worker's claims wait out their deadlines.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import anyio
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _redisbench import (
    Worker,
    remove_function_images,
    start_worker,
    throwaway_redis,
    workdir,
    write_function,
)
from _soaksqlite import SqliteBroker

from relay.adapters.redis.keys import invocation_key

TIMEOUT_S = 5
GRACE_S = 5  # an orphaned container stops itself within timeout + grace

TEMPLATE = """runtime: python3.14
concurrency: 4
env:
  SOAK_REDIS: "{address}"
  SOAK_KEY: "{key}"
events:
  - handler: soak.handler
    retries: 1
    timeout: {timeout}s
    pattern:
      kind: [soak]{extra}
"""
NOW_PATTERN = '\n      at:\n        gt: "now()-30s"'
BROKEN_TEMPLATE = "runtime: [python3.14\nevents: {\n"

HANDLER = """import os
import random
import socket
import time
import uuid

HOST, PORT = os.environ["SOAK_REDIS"].rsplit(":", 1)
KEY = os.environ["SOAK_KEY"].encode()


def _push(text):
    value = text.encode()
    command = b"*3\\r\\n$5\\r\\nRPUSH\\r\\n$%d\\r\\n%s\\r\\n$%d\\r\\n%s\\r\\n" % (
        len(KEY), KEY, len(value), value)
    with socket.create_connection((HOST, int(PORT)), timeout=2) as conn:
        conn.sendall(command)
        conn.recv(64)


def handler(event):
    run = uuid.uuid4().hex[:12]
    seq = event["seq"]
    _push(f"start|{seq}|{run}|{time.time_ns()}")
    time.sleep(1.0 if event.get("slow") else 0.01)
    ok = random.random() >= 0.1
    _push(f"end|{seq}|{run}|{time.time_ns()}|{'ok' if ok else 'fail'}")
    if not ok:
        raise RuntimeError("soak: injected failure")
"""


@dataclass
class Execution:
    start_ns: int
    end_ns: int | None = None
    ok: bool | None = None


@dataclass
class Findings:
    events: int
    executions: dict[int, dict[str, Execution]] = field(default_factory=dict)
    dlq_seqs: list[int] = field(default_factory=list)
    dlq_unparsable: int = 0
    pending: int = 0
    exhausted: int = 0  # ledger markers exhausted:N or exhausted:N:dlq
    exhausted_dead_lettered: int = 0  # exhausted:N:dlq
    kills_ns: list[int] = field(default_factory=list)

    def report(self) -> list[str]:
        succeeded = {s for s, runs in self.executions.items() if any(r.ok for r in runs.values())}
        dlq = set(self.dlq_seqs)
        lost = set(range(self.events)) - succeeded - dlq
        never_ok = set(range(self.events)) - succeeded
        concurrent, possible, reruns = self._overlaps()
        total = sum(len(runs) for runs in self.executions.values())
        unfinished = sum(
            r.end_ns is None for runs in self.executions.values() for r in runs.values()
        )
        duplicate_dlq = len(self.dlq_seqs) - len(dlq)
        return [
            f"events:                         {self.events}",
            f"executions:                     {total} ({unfinished} without an end mark: killed)",
            f"lost:                           {len(lost)}",
            f"concurrent duplicates:          {concurrent}",
            f"  overlapping a killed run:     {possible} (within its timeout + grace)",
            f"sequential re-runs:             {reruns} (at-least-once; expected)",
            f"exhausted invocations:          {self.exhausted} (in the ledger; "
            f"{self.exhausted_dead_lettered} of them marked dead-lettered)",
            f"DLQ entries:                    {len(self.dlq_seqs)} "
            f"(distinct events {len(dlq)}, duplicates {duplicate_dlq}, "
            f"unparsable {self.dlq_unparsable})",
            f"events that never succeeded:    {len(never_ok)}",
            f"DLQ entries of events that also succeeded: {len(dlq & succeeded)}"
            + self._lost_successes(dlq & succeeded),
            f"pending at the end:             {self.pending}",
        ]

    def _lost_successes(self, seqs: set[int]) -> str:
        """How long before a kill each of these events' successful runs ended."""
        gaps = []
        for seq in sorted(seqs):
            ends = [r.end_ns for r in self.executions[seq].values() if r.ok and r.end_ns]
            before = [k - e for e in ends for k in self.kills_ns if k - e >= 0]
            gaps.append(f"{min(before) / 1e6:.0f} ms" if before else "no kill after it")
        return f" (their success ended before a kill by: {', '.join(gaps)})" if gaps else ""

    def _overlaps(self) -> tuple[int, int, int]:
        concurrent = possible = reruns = 0
        limit_ns = (TIMEOUT_S + GRACE_S) * 1_000_000_000
        for runs in self.executions.values():
            ordered = sorted(runs.values(), key=lambda r: r.start_ns)
            reruns += max(0, len(ordered) - 1)
            for i, later in enumerate(ordered):
                for earlier in ordered[:i]:
                    if earlier.end_ns is not None:
                        concurrent += later.start_ns < earlier.end_ns
                    else:
                        possible += later.start_ns < earlier.start_ns + limit_ns
        return concurrent, possible, reruns


async def produce(broker: Broker, events: int, rate: float, burst: int = 1) -> str:
    """``events`` at ``rate``/s; with ``burst`` > 1, that many at a time in one
    write (one MULTI/EXEC, or one SQLite transaction), every fourth marked slow
    (the mid-batch variant)."""
    start, last = time.monotonic(), ""
    for first in range(0, events, burst):
        due = start + first / rate
        now = time.monotonic()
        if due > now:
            await anyio.sleep(due - now)
        at = datetime.now(UTC).isoformat()
        bodies: list[dict[str, Any]] = []
        for seq in range(first, min(events, first + burst)):
            body: dict[str, Any] = {"kind": "soak", "seq": seq, "at": at}
            if burst > 1 and seq % 4 == 0:
                body["slow"] = True
            bodies.append(body)
        last = await broker.send(bodies, together=burst > 1)
    return last


async def broken_restart(
    victim: dict[str, Worker],
    restart: Any,
    template: Path,
    every_s: float,
    log: list[str],
    kills_ns: list[int],
) -> None:
    """Kill b, restart it with its template broken, repair it 20 s later; then one
    plain kill as in the default variant."""
    path = anyio.Path(template)
    good = await path.read_text()
    await anyio.sleep(every_s)
    victim["b"].kill()
    kills_ns.append(time.time_ns())
    await path.write_text(BROKEN_TEMPLATE)
    victim["b"] = restart()
    log.append(f"killed worker b and restarted it with a broken template at {_now()}")
    await anyio.sleep(20)
    await path.write_text(good)
    log.append(f"repaired worker b's template at {_now()}")
    await anyio.sleep(every_s)
    victim["b"].kill()
    kills_ns.append(time.time_ns())
    log.append(f"killed worker b (SIGKILL) at {_now()}")
    await anyio.sleep(2)
    victim["b"] = restart()


def _now() -> str:
    return time.strftime("%H:%M:%S")


async def chaos(
    victim: dict[str, Worker],
    restart: Any,
    kills: int,
    every_s: float,
    log: list[str],
    kills_ns: list[int],
) -> None:
    for n in range(1, kills + 1):
        await anyio.sleep(every_s)
        victim["b"].kill()
        kills_ns.append(time.time_ns())
        log.append(f"killed worker b (SIGKILL #{n}) at {time.strftime('%H:%M:%S')}")
        await anyio.sleep(2)
        victim["b"] = restart()


async def chaos_mid_batch(
    broker: Broker,
    victim: dict[str, Worker],
    restart: Any,
    kills: int,
    every_s: float,
    log: list[str],
    kills_ns: list[int],
) -> None:
    """As :func:`chaos`, but each kill waits (up to 30 s) for b to hold a batch
    half settled: of the messages b took in the last 2 s (its own, not those a
    killed b left behind), some were just acknowledged and some are not."""
    for n in range(1, kills + 1):
        await anyio.sleep(every_s)
        last, held, deadline = -1, 0, time.monotonic() + 30
        while time.monotonic() < deadline:
            held = await broker.in_flight("soak-b")
            if 0 < held < last:
                break
            last = held
            await anyio.sleep(0.005)
        victim["b"].kill()
        kills_ns.append(time.time_ns())
        log.append(
            f"killed worker b (SIGKILL #{n}) with {held} of {last} messages still pending "
            f"at {_now()}"
        )
        await anyio.sleep(2)
        victim["b"] = restart()


class Broker(Protocol):
    """What the soak asks of the broker under test (Redis here, the embedded broker
    in ``_soaksqlite``); the marks always go to the bench's own Redis."""

    async def send(self, bodies: list[dict[str, Any]], *, together: bool) -> str:
        """Append the events (``together``: in one atomic write); the last id."""
        ...

    async def in_flight(self, consumer: str) -> int:
        """``consumer``'s unacknowledged messages delivered in the last 2 s."""
        ...

    async def settled(self, last: str) -> tuple[bool, int]:
        """Whether everything up to ``last`` was delivered and acknowledged; the
        number pending."""
        ...

    async def ledger_fields(self) -> list[tuple[str, str]]:
        """Every ``(field, marker)`` of the invocation ledgers of the stream."""
        ...

    async def dead_letter_events(self) -> list[str | None]:
        """The event of each DLQ entry, oldest first (``None``: the entry has none)."""
        ...

    def worker_env(self) -> dict[str, str]:
        """What a ``relay start`` needs besides the URL, stream and group."""
        ...

    async def close(self) -> None:
        """Forget the stream and its dead letters."""
        ...


@dataclass
class RedisBroker:
    client: Redis
    stream: str
    group: str

    async def send(self, bodies: list[dict[str, Any]], *, together: bool) -> str:
        pipe = self.client.pipeline(transaction=together)
        for body in bodies:
            pipe.xadd(self.stream, {"event": json.dumps(body)})
        last: str = (await pipe.execute())[-1]
        return last

    async def in_flight(self, consumer: str) -> int:
        client, stream, group = self.client, self.stream, self.group
        rows = await client.xpending_range(
            stream, group, min="-", max="+", count=1000, consumername=consumer, idle=2000
        )
        idle_or_older = len(rows)
        every = await client.xpending_range(
            stream, group, min="-", max="+", count=1000, consumername=consumer
        )
        return len(every) - idle_or_older

    async def settled(self, last: str) -> tuple[bool, int]:
        for info in await self.client.xinfo_groups(self.stream):
            if info["name"] == self.group:
                pending = int(info["pending"])
                return info["last-delivered-id"] == last and pending == 0, pending
        return False, -1

    async def ledger_fields(self) -> list[tuple[str, str]]:
        fields: list[tuple[str, str]] = []
        match = invocation_key(self.stream, self.group, "*")
        async for ledger in self.client.scan_iter(match=match, count=500):
            fields += (await self.client.hgetall(ledger)).items()
        return fields

    async def dead_letter_events(self) -> list[str | None]:
        entries = await self.client.xrange(f"relay:{self.stream}:dlq")
        return [fields.get("event") for _, fields in entries]

    def worker_env(self) -> dict[str, str]:
        return {}

    async def close(self) -> None:
        await self.client.delete(self.stream, f"relay:{self.stream}:dlq")


async def wait_settled(broker: Broker, last: str, limit_s: float) -> int:
    """Wait until the group has delivered everything and nothing is pending."""
    deadline = time.monotonic() + limit_s
    pending, shown = -1, 0.0
    while time.monotonic() < deadline:
        settled, pending = await broker.settled(last)
        if settled:
            return 0
        if time.monotonic() - shown >= 60:
            print(f"soak: {pending} pending at {time.strftime('%H:%M:%S')}", flush=True)
            shown = time.monotonic()
        await anyio.sleep(1)
    return pending


async def collect(broker: Broker, client: Redis, key: str, events: int, pending: int) -> Findings:
    """The broker's ledgers and dead letters, and the marks on the bench's Redis."""
    found = Findings(events=events, pending=pending)
    for name, marker in await broker.ledger_fields():
        if not name.startswith("@") and marker.startswith("exhausted:"):
            found.exhausted += 1
            found.exhausted_dead_lettered += marker.endswith(":dlq")
    executions: dict[int, dict[str, Execution]] = defaultdict(dict)
    for raw in await client.lrange(key, 0, -1):
        parts = raw.split("|")
        seq, run, at = int(parts[1]), parts[2], int(parts[3])
        if parts[0] == "start":
            executions[seq].setdefault(run, Execution(start_ns=at))
        else:
            execution = executions[seq].setdefault(run, Execution(start_ns=at))
            execution.end_ns, execution.ok = at, parts[4] == "ok"
    found.executions = dict(executions)
    for event in await broker.dead_letter_events():
        try:
            found.dlq_seqs.append(int(json.loads(event)["seq"]))  # type: ignore[arg-type]
        except (KeyError, ValueError, TypeError):
            found.dlq_unparsable += 1
    return found


async def soak(url: str, args: argparse.Namespace) -> None:
    suffix = secrets.token_hex(3)
    function, stream, group = f"soak-{suffix}", f"soak-{suffix}", "soak"
    key = f"soak:{suffix}:marks"
    address = url.removeprefix("redis://").split("/")[0]
    client = Redis.from_url(url, decode_responses=True)
    extra = NOW_PATTERN if args.variant == "now" else ""
    template = TEMPLATE.format(address=address, key=key, timeout=TIMEOUT_S, extra=extra)
    with workdir() as root:
        functions = write_function(root / "functions", function, template, {"soak.py": HANDLER})
        # b's own copy, so that only b ever sees the broken template
        b_functions = write_function(root / "functions-b", function, template, {"soak.py": HANDLER})
        broker: Broker = RedisBroker(client, stream, group)
        if args.broker == "sqlite":
            # the workers share one broker file; the bench's Redis only takes the marks
            broker = SqliteBroker(root / "broker.sqlite3", stream)

        def launch(name: str) -> Worker:
            own = b_functions if name == "b" and args.variant == "broken-template" else functions
            return start_worker(
                url=url,
                stream=stream,
                group=group,
                functions=own,
                workdir=root,
                name=f"soak-{name}",
                extra_env={"MAX_CONCURRENCY": "4", **broker.worker_env()},
            )

        workers: dict[str, Worker] = {}
        try:
            await run(args, broker, client, key, launch, workers, b_functions / function)
        except BaseException:
            for name, worker in workers.items():
                print(f"--- worker {name} log (tail) ---")
                print(worker.log_tail())
            raise
        finally:
            for worker in workers.values():
                worker.stop()
            remove_function_images(function)
            await client.delete(key)
            await broker.close()
            await client.aclose()


async def run(
    args: argparse.Namespace,
    broker: Broker,
    client: Redis,
    key: str,
    launch: Callable[[str], Worker],
    workers: dict[str, Worker],
    b_function: Path,
) -> None:
    """Start a and b, produce under chaos, wait for settling, print the report."""
    chaos_log: list[str] = []
    kills_ns: list[int] = []
    workers["a"] = launch("a")
    await wait_ready(broker, workers["a"], args.build_timeout)
    workers["b"] = launch("b")
    await anyio.sleep(5)  # b finds the image built and starts consuming
    await client.delete(key)  # forget the warm-up executions
    print(
        f"soak ({args.variant}{', embedded broker' if args.broker == 'sqlite' else ''}): "
        f"producing {args.events} events at {args.rate:.0f}/s"
    )
    async with anyio.create_task_group() as tg:
        every = args.events / args.rate / 4
        restart = partial(launch, "b")
        if args.variant == "broken-template":
            b_template = b_function / "template.yaml"
            tg.start_soon(broken_restart, workers, restart, b_template, every, chaos_log, kills_ns)
        elif args.variant == "mid-batch":
            tg.start_soon(chaos_mid_batch, broker, workers, restart, 3, every, chaos_log, kills_ns)
        else:
            tg.start_soon(chaos, workers, restart, 3, every, chaos_log, kills_ns)
        burst = 8 if args.variant == "mid-batch" else 1
        last = await produce(broker, args.events, args.rate, burst)
    for line in chaos_log:
        print(f"soak: {line}")
    print("soak: waiting for every event to settle (retries and recovery take minutes)")
    pending = await wait_settled(broker, last, args.settle_timeout)
    findings = await collect(broker, client, key, args.events, pending)
    findings.kills_ns = kills_ns
    print()
    for line in findings.report():
        print(line)


async def wait_ready(broker: Broker, worker: Worker, limit_s: float) -> None:
    """One warm-up event (seq -1, never counted) acknowledged means the worker serves."""
    deadline = time.monotonic() + limit_s
    last = await broker.send([{"kind": "soak", "seq": -1}], together=False)
    while time.monotonic() < deadline:
        if not worker.alive():
            raise SystemExit("soak: worker a exited during start-up")
        if (await broker.settled(last))[0]:
            return
        await anyio.sleep(0.5)
    raise SystemExit("soak: worker a did not become ready in time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--redis-url", default=None, help="a Redis the containers can reach")
    parser.add_argument("--build-timeout", type=float, default=600.0)
    parser.add_argument("--settle-timeout", type=float, default=1200.0)
    parser.add_argument(
        "--variant", choices=("kill", "now", "broken-template", "mid-batch"), default="kill"
    )
    parser.add_argument(
        "--broker",
        choices=("redis", "sqlite"),
        default="redis",
        help="the broker under test; with sqlite, two workers share one broker file and "
        "the throwaway Redis only takes the handler's execution marks",
    )
    args = parser.parse_args()
    with throwaway_redis(args.redis_url) as url:
        anyio.run(soak, url, args)


if __name__ == "__main__":
    main()
