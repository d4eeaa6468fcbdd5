"""Relay beside the peers its users compare it with, in one run on one private Redis.

    .venv/bin/python bench/peers.py [--jobs 10000] [--runs 3] [--redis-url URL]

Huey (``huey_consumer``, 2 worker processes) and Dramatiq (2 processes x 8 threads)
drain ``--jobs`` no-op jobs queued beforehand, in-process (no container, no
isolation: the work a task queue does per job and nothing else). Relay drains the
same number of events end to end: ``relay start`` on a no-op Python handler in
four hardened warm containers (MAX_CONCURRENCY=4, as ``bench/throughput.py``),
each burst timed from the first XADD to the last XACK.

A peer's rate is timed from the moment its queue first shrinks (the consumer is
up) to the moment the queue is empty, so its start-up is not counted; Relay's
worker is warm before its bursts. Medians of ``--runs``, and Relay's median over
Huey's and Dramatiq's, printed together: the ratio is the figure (machines differ
by a factor of two from week to week).

The peers live in a venv of their own (``.testbed/peers``, made on first use with
pinned releases; they are not Relay's dependencies). Not a test: no assertions.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from redis import Redis as SyncRedis
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _redisbench import (
    add_burst,
    remove_function_images,
    start_noop_worker,
    throwaway_redis,
    wait_acked,
    warm_up,
    workdir,
)

ROOT = Path(__file__).resolve().parents[1]
PEERS_VENV = ROOT / ".testbed" / "peers"
# the releases measured; the Redis client is the one Relay's lock pins
PEER_PACKAGES = ("huey==3.5.4", "dramatiq[redis]==2.2.1", "redis==8.1.0")

HUEY_TASKS = """
from huey import RedisHuey
huey = RedisHuey("bench", url={url!r}, results=False)

@huey.task()
def noop(n):
    return None
"""

DRAMATIQ_TASKS = """
import dramatiq
from dramatiq.brokers.redis import RedisBroker
dramatiq.set_broker(RedisBroker(url={url!r}))

@dramatiq.actor(max_retries=0)
def noop(n):
    return None
"""

ENQUEUE = """
import sys
sys.path.insert(0, {tasks!r})
from {module} import noop
for n in range({jobs}):
    noop{call}(n)
"""


def peers_python() -> Path:
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        print(f"peers: creating {PEERS_VENV} ({', '.join(PEER_PACKAGES)})")
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    return python


def drain(
    url: str, tasks: Path, jobs: int, queue: tuple[str, str], consumer: list[str]
) -> float:
    """Jobs/s of ``consumer`` over ``jobs`` queued jobs (``queue``: the key and
    how its length is read, ``llen`` or ``hlen``)."""
    client = SyncRedis.from_url(url)
    key, kind = queue
    length = client.llen if kind == "llen" else client.hlen
    proc = subprocess.Popen(
        consumer, cwd=tasks, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 600
        while length(key) >= jobs:  # the consumer starting up
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"peers: {consumer[0]} never took a job")
            time.sleep(0.002)
        first = time.monotonic()
        while length(key) > 0:
            if time.monotonic() > deadline:
                raise SystemExit(f"peers: {consumer[0]} did not drain its queue")
            time.sleep(0.002)
        return (jobs - 1) / (time.monotonic() - first)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for name in [*client.scan_iter("huey*"), *client.scan_iter("dramatiq*")]:
            client.delete(name)  # the peer's keys only: Relay's stream stays
        client.close()


def enqueue(python: Path, tasks: Path, module: str, call: str, jobs: int) -> None:
    code = ENQUEUE.format(tasks=str(tasks), module=module, jobs=jobs, call=call)
    subprocess.run([str(python), "-c", code], cwd=tasks, check=True)


def huey_rate(python: Path, url: str, tasks: Path, jobs: int) -> float:
    enqueue(python, tasks, "hueytasks", "", jobs)
    consumer = [str(python.parent / "huey_consumer"), "hueytasks.huey", "-k", "process",
                "-w", "2", "-q"]
    return drain(url, tasks, jobs, ("huey.redis.bench", "llen"), consumer)


def dramatiq_rate(python: Path, url: str, tasks: Path, jobs: int) -> float:
    enqueue(python, tasks, "dramatiqtasks", ".send", jobs)
    consumer = [str(python.parent / "dramatiq"), "dramatiqtasks", "--processes", "2",
                "--threads", "8"]
    return drain(url, tasks, jobs, ("dramatiq:default.msgs", "hlen"), consumer)


async def run(args: argparse.Namespace, python: Path, url: str, tasks: Path) -> None:
    client = Redis.from_url(url, decode_responses=True)
    stream = function = "bench-peers-relay"
    huey: list[float] = []
    dramatiq: list[float] = []
    relay: list[float] = []
    with workdir() as root:
        worker = start_noop_worker(url=url, stream=stream, group="relay-peers", root=root,
                                   function=function, name="bench-peers", concurrency=4)
        try:
            await warm_up(client, stream, "relay-peers", worker, 600)
            for n in range(args.runs):  # interleaved: each run sees nearly the same machine
                huey.append(await anyio.to_thread.run_sync(huey_rate, python, url, tasks,
                                                           args.jobs))
                dramatiq.append(await anyio.to_thread.run_sync(dramatiq_rate, python, url,
                                                               tasks, args.jobs))
                began = time.monotonic()
                last = await add_burst(client, stream, args.jobs, first_seq=1_000_000 * (n + 1))
                done = await wait_acked(client, stream, "relay-peers", last, 600, worker.alive)
                relay.append(args.jobs / (done - began))
                await client.xtrim(stream, maxlen=0)
                print(f"run {n + 1}: Huey {huey[-1]:,.0f}  Dramatiq {dramatiq[-1]:,.0f}  "
                      f"Relay {relay[-1]:,.0f} jobs/s")
        finally:
            worker.stop()
            remove_function_images(function)
            await client.aclose()
    h, d, r = (statistics.median(x) for x in (huey, dramatiq, relay))
    print(f"\nmedian jobs/s: Huey (2 processes) {h:,.0f}, Dramatiq (2x8) {d:,.0f}, "
          f"Relay end to end (4 containers) {r:,.0f}")
    print(f"Relay/Huey {r / h:.2f}x (goal 2.5x), Relay/Dramatiq {r / d:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    python = peers_python()
    with throwaway_redis(args.redis_url) as url, tempfile.TemporaryDirectory() as tmp:
        tasks = Path(tmp)
        (tasks / "hueytasks.py").write_text(HUEY_TASKS.format(url=url))
        (tasks / "dramatiqtasks.py").write_text(DRAMATIQ_TASKS.format(url=url))
        anyio.run(run, args, python, url, tasks)


if __name__ == "__main__":
    main()
