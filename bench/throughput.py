"""End-to-end throughput of Relay next to a raw XREADGROUP/XACK loop, in one run.

    .venv/bin/python bench/throughput.py [--events 20000] [--latency-events 30000]
                                         [--runs 3] [--same-rate 2400]
                                         [--redis-url URL] [--skip-relay] [--compose]
                                         [--processes 1,2]

Against one throwaway Redis (a container of relay-testbed/redis:7, else a local
redis-server; removed afterwards) it measures:

(a) the baselines, no Relay at all: one consumer process doing XREADGROUP
    (COUNT 16) then one XACK per message, and the same with one XACK per batch;
(b) what the machine allows (``bench/_lean.py``): per event the same Redis and
    Docker calls as Relay (batched XREADGROUP, the ledger's begin and finish
    scripts, one request to one of four warm containers) through hand-written
    asyncio protocols, and nothing else;
(b') the adapters alone (``bench/_floor.py``): the same calls through Relay's own
    adapters, with no dispatcher, bus, metrics or slots: the ceiling for (c);
(c) Relay end to end: the real ``relay start`` with a no-op Python handler and
    MAX_CONCURRENCY=4 (so four warm containers), after a warm-up; with
    ``--processes 1,2`` once per count (``relay start --processes N``: N worker
    processes, four warm containers each), one after the other in the same run.
(d) with ``--compose``: the same no-op function in the compose.dev.yaml deployment
    (Relay's image behind the socket proxy), once as shipped (the per-container
    socket through the shared directory, RELAY_DIRECT_DIR) and once with it off
    (requests over the attach stream, through the proxy). Phases (a) and (c) then
    use the first stack's Redis instead of a throwaway one, and the attach run its
    own stack's, configured the same (``bench/_compose.py``).

Every consumer gets ``--runs`` bursts and as many paced runs (3 by default). The
table shows the median of each figure over its runs and lists every run's rate
and p99 under it: one paced run's p99 moves by a factor of two between identical
runs on this machine, so a single run meets or misses a 5 ms target by luck.

For each: events/s from the first XADD of a burst of N until everything is
acknowledged (the burst is written by hand-packed, pipelined XADDs, under
1 us of CPU per event, so the producer takes almost nothing from what it
measures); Redis commands per handled event from ``INFO commandstats`` deltas
(commands run inside Lua scripts included, the benchmark's own XADD/INFO/XINFO
excluded); then, at half the median burst rate:

- p50/p99 from XADD to XACK without MONITOR (which taxes Redis per command,
  about ten per handled event for Relay against one for the raw loop): from just
  before each XADD is sent to the moment a client learns of its acknowledgment.
  The raw consumer stamps its own XACK replies; for Relay the instrument
  subscribes to the key-event notification of the ledger hash's TTL, which the
  script that XACKs sets in the same atomic step, and stamps its arrival (one
  CLOCK_MONOTONIC). The instrument is one thread on raw sockets
  (``_redisbench.paced_run``); its own CPU share is printed under the table,
  since it competes for the same two cores. The paced run lasts about ten
  seconds at Relay's half rate (``--latency-events``): a two-second run on this
  noisy machine meets or misses a 5 ms p99 by luck;
- in a separate, shorter paced run under MONITOR, the top-level commands per
  event (round trips; pipelined commands count one each).

With ``--same-rate R``, (b), (b') and (c) are also paced at R events/s each, and a
second table gives p50/p99 there with the CPU each event cost the consumer
process and Redis (``INFO cpu``). Each consumer's own half rate differs, so the
first table compares latencies under different loads; this one compares code.

Targets for (c) on the 2-core machine: >= 3,000 events/s, <= 3 round trips per
event, p99 < 5 ms. Figures vary per machine: read the ratios to (a); the
distance from (b) to (b') is what the layers of Relay's adapters cost, and from
(b') to (c) what the rest of Relay costs.
"""

from __future__ import annotations

import argparse
import functools
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import redis as redis_sync
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _compose import ComposeWorker, compose_stack
from _redisbench import (
    NOOP_HANDLER,
    NOOP_TEMPLATE,
    LatencyRun,
    SteadyRun,
    add_burst,
    command_counts,
    delta,
    latencies,
    monitored_round_trips,
    paced_adds,
    percentile,
    remove_function_images,
    settle_latency,
    start_noop_worker,
    steady_run,
    throwaway_redis,
    wait_acked,
    warm_up,
    workdir,
    write_function,
)
from warm import build_image

HERE = Path(__file__).resolve().parent
BATCH = 16
MONITORED_EVENTS = 1_000  # the round-trip count's own paced run, under MONITOR


@dataclass
class Result:
    """One consumer's figures; every rate and latency is one per run (``--runs``)
    and the table shows their medians."""

    label: str
    events: int
    seconds: list[float]  # one per burst
    commands: dict[str, int]  # over all the bursts
    latency: LatencyRun | None = None  # round trips (the MONITOR run)
    paced: list[list[float]] = field(default_factory=list)  # ms, one list per paced run
    paced_events: int = 0  # XADDs per paced run
    steady: list[SteadyRun] = field(default_factory=list)

    @property
    def rates(self) -> list[float]:
        return [self.events / s for s in self.seconds]

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def commands_per_event(self) -> float:
        return sum(self.commands.values()) / (self.events * len(self.seconds))


async def bursts(
    label: str,
    client: Redis,
    stream: str,
    group: str,
    events: int,
    runs: int,
    alive: Any = None,
) -> Result:
    """``runs`` bursts of ``events`` XADDs, each timed until all are acknowledged,
    with the Redis commands they cost."""
    before = await command_counts(client)
    seconds = []
    for run in range(runs):
        started = time.monotonic()
        last = await add_burst(client, stream, events, first_seq=1_000_000 * (run + 1))
        seconds.append(await wait_acked(client, stream, group, last, 600, alive) - started)
    after = await command_counts(client)
    return Result(label, events, seconds, delta(before, after))


async def settled_at_half_rate(
    result: Result,
    url: str,
    stream: str,
    group: str,
    latency_events: int,
    same_rate: float | None,
    consumer_pid: int,
) -> None:
    """XADD->XACK latency (:func:`settle_latency`: any consumer that settles through
    the ledger's scripts) in one paced run per burst, and round trips, at half the
    median burst rate; with ``same_rate``, also as many paced runs at that rate
    with CPU per event (:func:`steady_run`)."""
    rate = result.rate / 2
    result.paced_events = latency_events
    cpu = []
    for _ in result.seconds:
        settled = await settle_latency(url, stream, group, rate, latency_events)
        result.paced.append(settled.latencies_ms)
        cpu.append(settled.instrument_cpu)
    result.latency = await monitored_round_trips(url, stream, group, rate, MONITORED_EVENTS)
    result.latency.instrument_cpu = statistics.median(cpu)
    if same_rate:
        for _ in result.seconds:
            result.steady.append(
                await steady_run(url, stream, group, same_rate, latency_events, consumer_pid)
            )


# --- (a) the raw loop ------------------------------------------------------------------


def raw_consumer(url: str, stream: str, group: str, mode: str, times: str) -> None:
    """The baseline consumer, run in its own process (as Relay is): XREADGROUP a
    batch, then one XACK per message (``each``) or one for the batch (``batch``).
    It stamps each id with ``time.monotonic()`` when its XACK is answered and,
    on SIGTERM, writes those stamps to ``times`` (one ``id stamp`` per line)."""
    client = redis_sync.Redis.from_url(url, decode_responses=True)
    acked: list[tuple[str, float]] = []

    def dump(_signum: int, _frame: object) -> None:
        Path(times).write_text("".join(f"{i} {t!r}\n" for i, t in acked))
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, dump)
    while True:
        reply: Any = client.xreadgroup(group, "raw", {stream: ">"}, count=BATCH, block=1000)
        for _, entries in reply or []:
            ids = [entry_id for entry_id, _fields in entries]
            if mode == "batch":
                client.xack(stream, group, *ids)
                stamp = time.monotonic()
                acked.extend((i, stamp) for i in ids)
            else:
                for entry_id in ids:
                    client.xack(stream, group, entry_id)
                    acked.append((entry_id, time.monotonic()))


async def raw_phase(url: str, events: int, latency_events: int, runs: int, mode: str) -> Result:
    stream, group = f"bench-raw-{secrets.token_hex(4)}", "raw"
    client = Redis.from_url(url, decode_responses=True)
    await client.xgroup_create(stream, group, id="0", mkstream=True)
    times = Path(tempfile.mkdtemp(prefix="relay-bench-raw-")) / "acked.txt"
    consumer = await anyio.open_process(
        [sys.executable, __file__, "--raw-consumer", url, stream, group, mode, str(times)],
        stdout=None,
        stderr=None,
    )
    label = "raw, XACK per event" if mode == "each" else "raw, XACK per batch"
    try:
        result = await bursts(label, client, stream, group, events, runs)
        rate = result.rate / 2
        result.paced_events = latency_events
        paced = []
        for _ in range(runs):
            paced.append(await paced_adds(url, stream, rate, latency_events))
            await wait_acked(client, stream, group, list(paced[-1].sent)[-1], 300)
        result.latency = await monitored_round_trips(url, stream, group, rate, MONITORED_EVENTS)
        consumer.terminate()
        await consumer.wait()
        acked = dict(_stamp(line) for line in times.read_text().splitlines())
        result.paced = [latencies(run.sent, acked) for run in paced]
        result.latency.instrument_cpu = statistics.median(run.cpu_share for run in paced)
    finally:
        if consumer.returncode is None:
            consumer.kill()
            await consumer.wait()
        shutil.rmtree(times.parent, ignore_errors=True)
        await client.delete(stream)
        await client.aclose()
    return result


def _stamp(line: str) -> tuple[str, float]:
    entry_id, stamp = line.split()
    return entry_id, float(stamp)


# --- (b) the adapters alone --------------------------------------------------------------


async def floor_phase(
    url: str,
    events: int,
    latency_events: int,
    runs: int,
    containers: int,
    same_rate: float | None = None,
    *,
    lean: bool = False,
) -> Result:
    """``bench/_floor.py`` (Relay's Redis and Docker calls per event through its
    adapters, no Relay logic) or, with ``lean``, ``bench/_lean.py`` (the same calls
    with hand-written protocols)."""
    stream, group = f"bench-floor-{secrets.token_hex(4)}", "floor"
    client = Redis.from_url(url, decode_responses=True)
    await client.xgroup_create(stream, group, id="0", mkstream=True)
    image = await anyio.to_thread.run_sync(build_image)
    script = HERE / ("_lean.py" if lean else "_floor.py")
    consumer = await anyio.open_process(
        [sys.executable, str(script), url, stream, group, image, str(containers)],
        stdout=None,
        stderr=None,
    )
    try:
        for _ in range(2):  # containers started, then every one of them warm
            last = await add_burst(client, stream, 400)
            await wait_acked(client, stream, group, last, 120, lambda: consumer.returncode is None)
        label = "lean protocols" if lean else "adapters only"
        result = await bursts(label, client, stream, group, events, runs)
        await settled_at_half_rate(
            result, url, stream, group, latency_events, same_rate, consumer.pid
        )
    finally:
        consumer.kill()
        await consumer.wait()
        await client.delete(stream)
        await client.aclose()
        await anyio.run_process(["docker", "rmi", "-f", image], check=False)
    return result


# --- (c) Relay end to end ---------------------------------------------------------------


async def relay_phase(
    url: str,
    events: int,
    latency_events: int,
    runs: int,
    build_timeout: float,
    same_rate: float | None = None,
    processes: int = 1,
) -> Result:
    suffix = secrets.token_hex(3)
    function = f"bench-noop-{suffix}"
    stream, group = f"bench-relay-{suffix}", "relay-bench"
    client = Redis.from_url(url, decode_responses=True)
    with workdir() as root:
        worker = start_noop_worker(
            url=url,
            stream=stream,
            group=group,
            root=root,
            function=function,
            name="bench-worker",
            concurrency=4,
            processes=processes,
        )
        try:
            print(f"relay: starting the worker and building {function} (first build is slow)")
            await warm_up(client, stream, group, worker, build_timeout)
            label = "relay end to end" + (f" ({processes} processes)" if processes > 1 else "")
            result = await bursts(label, client, stream, group, events, runs, worker.alive)
            await settled_at_half_rate(
                result, url, stream, group, latency_events, same_rate, worker.proc.pid
            )
        except BaseException:
            print("--- worker log (tail) ---")
            print(worker.log_tail())
            raise
        finally:
            worker.stop()
            remove_function_images(function)
            await client.delete(stream, f"relay:{stream}:dlq")
            await client.aclose()
    return result


async def compose_phase(
    worker: ComposeWorker,
    url: str,
    stream: str,
    events: int,
    latency_events: int,
    runs: int,
    build_timeout: float,
    same_rate: float | None = None,
) -> Result:
    group = "relay-bench"
    client = Redis.from_url(url, decode_responses=True)
    try:
        print("compose: warming up relay in its container (first build is slow)")
        # warm_up needs only .alive() of its worker, which ComposeWorker has too
        await warm_up(client, stream, group, worker, build_timeout)  # type: ignore[arg-type]
        label = "relay in compose, direct" if worker.direct else "relay in compose, attach"
        result = await bursts(label, client, stream, group, events, runs, worker.alive)
        await settled_at_half_rate(
            result, url, stream, group, latency_events, same_rate, worker.pid
        )
    except BaseException:
        print("--- compose relay log (tail) ---")
        print(worker.log_tail())
        raise
    finally:
        await client.aclose()
    return result


async def _compose_run(
    stack: ComposeWorker, url: str, stream: str, args: argparse.Namespace
) -> Result:
    return await compose_phase(
        stack,
        url,
        stream,
        args.events,
        args.latency_events,
        args.runs,
        args.build_timeout,
        args.same_rate,
    )


def _phases(args: argparse.Namespace, url: str) -> list[Result]:
    results = [
        anyio.run(raw_phase, url, args.events, args.latency_events, args.runs, mode)
        for mode in ("each", "batch")
    ]
    if args.skip_relay:
        return results
    if not args.compose:  # the floors say nothing new about the deployment
        for lean in (True, False):
            results.append(
                anyio.run(
                    functools.partial(floor_phase, lean=lean),
                    url,
                    args.events,
                    args.latency_events,
                    args.runs,
                    4,
                    args.same_rate,
                )
            )
    for processes in args.processes:
        results.append(
            anyio.run(
                functools.partial(relay_phase, processes=processes),
                url,
                args.events,
                args.latency_events,
                args.runs,
                args.build_timeout,
                args.same_rate,
            )
        )
    return results


# --- report ---------------------------------------------------------------------------------


def _median_of(runs: list[list[float]], q: float) -> float:
    """The median over runs of each run's ``q`` percentile."""
    values = [percentile(run, q) for run in runs if run]
    return statistics.median(values) if values else float("nan")


def report(results: list[Result]) -> None:
    base = results[0]
    runs = len(base.seconds)
    print()
    header = f"{'':22} {'events/s':>9} {'x raw':>6} {'cmds/ev':>8} {'rt/ev':>6} "
    header += f"{'p50 ms':>7} {'p99 ms':>7} {'at ev/s':>8}"
    print(header)
    for r in results:
        lat = r.latency
        rt = lat.round_trips / lat.events if lat and lat.events else float("nan")
        print(
            f"{r.label:22} {r.rate:9.0f} {r.rate / base.rate:6.2f} {r.commands_per_event:8.2f} "
            f"{rt:6.2f} {_median_of(r.paced, 0.5):7.2f} {_median_of(r.paced, 0.99):7.2f} "
            f"{r.rate / 2:8.0f}"
        )
    print()
    print(f"events/s, p50, p99: medians of {runs} run(s) each (--runs); every run below")
    print("cmds/ev: INFO commandstats delta per event (incl. commands inside Lua scripts)")
    print("rt/ev:   top-level commands per event seen by MONITOR at half rate (round trips)")
    print("p50/p99: XADD sent -> XACK known to a client, at half rate, without MONITOR")
    for r in results:
        rates = " ".join(f"{rate:.0f}" for rate in r.rates)
        p99s = " ".join(f"{percentile(run, 0.99):.2f}" for run in r.paced if run)
        print(f"  {r.label}: events/s {rates}; p99 ms {p99s}")
    shares = ", ".join(
        f"{r.label} {r.latency.instrument_cpu * 100:.0f}%" for r in results if r.latency
    )
    print(f"  the producer and probe's own CPU then, as a share of one core: {shares}")
    for r in results:
        top = sorted(r.commands.items(), key=lambda kv: -kv[1])
        handled = r.events * len(r.seconds)
        breakdown = ", ".join(f"{name}={calls / handled:.2f}" for name, calls in top[:10])
        print(f"  {r.label}: {breakdown}")
        measured = sum(len(run) for run in r.paced)
        if r.paced and measured < r.paced_events * len(r.paced):
            print(
                f"  {r.label}: latency measured for {measured} of "
                f"{r.paced_events * len(r.paced)} events"
            )
    report_steady(results)


def report_steady(results: list[Result]) -> None:
    steady = [(r.label, r.steady) for r in results if r.steady]
    if not steady:
        return
    print()
    print(
        f"{'at one rate for all':22} {'p50 ms':>7} {'p99 ms':>7} {'consumer us/ev':>15} "
        f"{'redis us/ev':>12}"
    )
    for label, runs in steady:
        lats = [run.latencies_ms for run in runs]
        consumer = statistics.median(run.consumer_us for run in runs)
        server = statistics.median(run.redis_us for run in runs)
        print(
            f"{label:22} {_median_of(lats, 0.5):7.2f} {_median_of(lats, 0.99):7.2f} "
            f"{consumer:15.0f} {server:12.0f}"
        )
    print("medians of the runs; consumer/redis us/ev: CPU time of the consumer process and")
    print("of Redis per event")
    for label, runs in steady:
        p99s = " ".join(f"{percentile(run.latencies_ms, 0.99):.2f}" for run in runs)
        cpu = " ".join(f"{run.consumer_us:.0f}" for run in runs)
        print(f"  {label}: p99 ms {p99s}; consumer us/ev {cpu}")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _process_counts(text: str) -> list[int]:
    return [_at_least_one(part) for part in text.split(",") if part.strip()] or [1]


def main() -> None:
    if len(sys.argv) == 7 and sys.argv[1] == "--raw-consumer":
        raw_consumer(*sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--latency-events", type=int, default=30_000)
    parser.add_argument(
        "--runs",
        type=_at_least_one,
        default=3,
        help="bursts and paced runs per consumer; the table shows their medians",
    )
    parser.add_argument("--redis-url", default=None, help="use this Redis instead of a new one")
    parser.add_argument("--skip-relay", action="store_true", help="only the raw baselines")
    parser.add_argument("--build-timeout", type=float, default=600.0)
    parser.add_argument(
        "--same-rate",
        type=float,
        default=None,
        metavar="R",
        help="also pace the ledger consumers at R events/s each, with CPU per event",
    )
    parser.add_argument(
        "--processes",
        type=_process_counts,
        default=[1],
        metavar="N[,N...]",
        help="relay end to end with each of these `relay start --processes` counts, in "
        "turn (e.g. 1,2: one and two worker processes in one run); 4 containers each",
    )
    parser.add_argument(
        "--compose",
        action="store_true",
        help="also run relay in the compose.dev.yaml deployment, on that stack's Redis",
    )
    args = parser.parse_args()
    if not args.compose:
        with throwaway_redis(args.redis_url) as url:
            report(_phases(args, url))
        return
    suffix = secrets.token_hex(3)
    function, stream = f"bench-noop-{suffix}", f"bench-compose-{suffix}"
    with workdir() as root:
        functions = write_function(
            root / "functions",
            function,
            NOOP_TEMPLATE.format(concurrency=4),
            {"noop.py": NOOP_HANDLER},
        )
        try:
            with compose_stack(functions, stream, direct=True) as stack:
                url = stack.redis_url()
                results = _phases(args, url)
                results.append(anyio.run(_compose_run, stack, url, stream, args))
            # the fast path off: a stack of its own (its Redis is configured the same)
            with compose_stack(functions, stream, direct=False) as stack:
                results.append(anyio.run(_compose_run, stack, stack.redis_url(), stream, args))
        finally:
            remove_function_images(function)
    report(results)


if __name__ == "__main__":
    main()
