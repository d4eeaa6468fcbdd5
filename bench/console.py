"""Delivery throughput with the run history off, on, and on with the console's
overview served at 50 requests/s, in one run (issue 34).

    .venv/bin/python bench/console.py [--events 20000] [--runs 3] [--rate 50]
                                      [--redis-url URL]

Against one throwaway Redis (as ``bench/throughput.py``), two ``relay start``
workers one after the other, each on a no-op Python function with four warm
containers (MAX_CONCURRENCY=4), after a warm-up:

1. ``RUN_HISTORY_LIMIT=0``: no run history (the subscriber is not even
   registered): the "before" of issue 34 item 1;
2. the defaults (run history on) and ``CONSOLE_ADDR`` on loopback: ``--runs``
   bursts without console load, alternating with as many bursts while a client
   GETs the overview (``/``) at ``--rate`` requests/s, paced by the clock (a
   slow answer does not lower the offered rate).

Each burst: events/s from the first XADD of ``--events`` until all are
acknowledged. The table gives the median of each phase with every run listed,
the ratios to the first phase, and for the loaded phase the overview requests
answered, their p50/p99, and any that failed. Figures vary per machine and per
load: run it on a quiet machine and read the ratios.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import anyio
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _redisbench import (
    add_burst,
    free_port,
    percentile,
    remove_function_images,
    start_noop_worker,
    throwaway_redis,
    wait_acked,
    warm_up,
    workdir,
)

BUILD_TIMEOUT_S = 600.0


@dataclass
class Load:
    """What the overview load offered and got."""

    latencies_ms: list[float] = field(default_factory=list)
    failed: int = 0
    offered: int = 0


@dataclass
class Phase:
    label: str
    rates: list[float] = field(default_factory=list)
    load: Load | None = None

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


async def burst(client: Redis, stream: str, group: str, events: int, seq: int,
                alive: object) -> float:
    started = time.monotonic()
    last = await add_burst(client, stream, events, first_seq=seq)
    return events / (await wait_acked(client, stream, group, last, 600, alive) - started)


async def overview_load(url: str, rate: float, load: Load, stop: anyio.Event) -> None:
    """GET ``url`` at ``rate``/s by the clock until ``stop``; each request on its own
    connection (the console closes each one)."""
    period = 1.0 / rate
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http, anyio.create_task_group() as tg:
        while not stop.is_set():
            tg.start_soon(_one_request, http, url, load)
            load.offered += 1
            wait = started + load.offered * period - time.monotonic()
            with anyio.move_on_after(max(0.0, wait)):
                await stop.wait()


async def _one_request(http: aiohttp.ClientSession, url: str, load: Load) -> None:
    sent = time.monotonic()
    try:
        async with http.get(url) as response:
            await response.read()
            ok = response.status == 200
    except (TimeoutError, aiohttp.ClientError):
        ok = False
    if ok:
        load.latencies_ms.append((time.monotonic() - sent) * 1000)
    else:
        load.failed += 1


async def worker_phases(url: str, args: argparse.Namespace, *, history: bool
                        ) -> list[Phase]:
    suffix = secrets.token_hex(3)
    function, stream, group = f"bench-console-{suffix}", f"bench-console-{suffix}", "bench"
    port = free_port()
    env = {"CONSOLE_ADDR": f"127.0.0.1:{port}"} if history else {"RUN_HISTORY_LIMIT": "0"}
    client = Redis.from_url(url, decode_responses=True)
    with workdir() as root:
        worker = start_noop_worker(url=url, stream=stream, group=group, root=root,
                                   function=function, name="bench-console", concurrency=4,
                                   extra_env=env)
        try:
            print(f"console bench: warming up a worker (history {'on' if history else 'off'})")
            await warm_up(client, stream, group, worker, BUILD_TIMEOUT_S)
            return await _bursts(client, stream, group, args, worker.alive,
                                 f"http://127.0.0.1:{port}/" if history else None)
        except BaseException:
            print(worker.log_tail())
            raise
        finally:
            worker.stop()
            remove_function_images(function)
            await client.delete(stream)
            await client.aclose()


async def _bursts(client: Redis, stream: str, group: str, args: argparse.Namespace,
                  alive: object, console: str | None) -> list[Phase]:
    if console is None:
        quiet = Phase("run history off")
        for run in range(args.runs):
            quiet.rates.append(await burst(client, stream, group, args.events,
                                           1_000_000 * (run + 1), alive))
        return [quiet]
    quiet, loaded = Phase("run history on"), Phase(f"on + overview at {args.rate:g}/s")
    loaded.load = Load()
    for run in range(args.runs):  # alternating: drift on the machine hits both alike
        seq = 2_000_000 * (run + 1)
        quiet.rates.append(await burst(client, stream, group, args.events, seq, alive))
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(overview_load, console, args.rate, loaded.load, stop)
            loaded.rates.append(await burst(client, stream, group, args.events,
                                            seq + 1_000_000, alive))
            stop.set()
    return [quiet, loaded]


def report(phases: list[Phase]) -> None:
    base = phases[0].rate
    print(f"\n{'phase':<34} {'events/s':>10} {'ratio':>7}   runs")
    for p in phases:
        runs = ", ".join(f"{r:,.0f}" for r in p.rates)
        print(f"{p.label:<34} {p.rate:>10,.0f} {p.rate / base:>7.2f}   {runs}")
    for p in phases:
        if p.load is None:
            continue
        lat = sorted(p.load.latencies_ms)
        print(f"\noverview requests: {p.load.offered} offered, {len(lat)} answered 200,"
              f" {p.load.failed} failed")
        if lat:
            print(f"overview latency: p50 {percentile(lat, 0.50):.1f} ms,"
                  f" p99 {percentile(lat, 0.99):.1f} ms")


async def main_async(args: argparse.Namespace) -> None:
    with throwaway_redis(args.redis_url) as url:
        phases = await worker_phases(url, args, history=False)
        phases += await worker_phases(url, args, history=True)
    report(phases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=50.0, help="overview requests per second")
    parser.add_argument("--redis-url", default=None)
    anyio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
