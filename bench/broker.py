"""The embedded broker's evidence, measured in one run on this machine.

    .venv/bin/python bench/broker.py [--jobs 5000] [--runs 3] [--dir DIR]
                                     [--depth-seconds 12] [--profile FILE]

Every figure is with ``synchronous=FULL`` in WAL mode, on a file in ``--dir``
(default: a new temporary directory). It prints:

- **fsync**: a timed ``write(4 KiB) + os.fsync`` loop on that disk, so the
  durable figures below can be read against what one durable commit costs here;
- **raw loop**: the same SQL as the broker (the four candidate lookups, the
  fenced lease, the fenced acknowledgment), one transaction per state change,
  on one connection, with none of Relay's code: what a naive queue gets;
- **raw loop, group-committed**: the statements Relay's broker runs for a job
  (the lease, the ledger rows its ``begin`` and ``finish`` write, the fenced
  acknowledgment), 16 jobs per transaction, three transactions per round, with
  none of Relay's code: the ceiling of SQLite plus fsync here, against which
  the broker's own Python shows;
- **Relay broker**: 4 workers at concurrency 16 through Relay's own adapters and
  its consumer's buffer and dispatcher tasks (``SqliteEventStream.read`` leases,
  ``SqliteInvocationLedger.begin`` claims the invocation, ``finish`` records the
  result and acknowledges): jobs/s for ``--jobs`` jobs per run, ``--runs`` runs,
  medians, with the CPU time per job of the event loop's thread and of the
  writer thread (CPU time moves far less than wall time on a shared machine) and
  the steps per commit; then p50/p99 of lease+ACK (from the read that leased
  the job to the acknowledgment's commit) with jobs arriving at half the median
  rate;
- **64 claimers**: the peak RSS of a process whose 64 concurrent claimers run
  the same jobs (``ru_maxrss``, its own process);
- **depth vs RSS**: arrival at twice the processing rate; the queue depth and
  the process's RSS, sampled each second, until the depth has grown tenfold.

Each state change is committed before its caller learns of it: the broker's
writer thread answers only after ``COMMIT``; concurrent steps share one
transaction (group commit).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from relay.adapters.sqlite.broker import jobs  # noqa: E402 - after the path fix-up
from relay.adapters.sqlite.broker.ledger import (  # noqa: E402
    ACK_SQL,
    LOAD_SQL,
    UPSERT_SQL,
    SqliteInvocationLedger,
)
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher  # noqa: E402
from relay.adapters.sqlite.broker.store import BrokerStore, connect  # noqa: E402
from relay.adapters.sqlite.broker.stream import SqliteEventStream  # noqa: E402
from relay.adapters.system import SystemClock  # noqa: E402
from relay.application.consumer import Dispatchers, MessageBuffer  # noqa: E402
from relay.domain.invocation import Complete  # noqa: E402
from relay.domain.outcome import (  # noqa: E402
    AttemptReport,
    BeginRequest,
    ClaimRequest,
    FinishRequest,
    MessageContext,
    StreamMessage,
)

FIELD = "fn/h.run"
PAYLOAD = b'{"kind": "job"}'


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- fsync ------------------------------------------------------------------------
def fsync_loop(directory: Path, n: int = 2000) -> dict[str, float]:
    path = directory / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    block = b"\0" * 4096
    times: list[float] = []
    try:
        for _ in range(n):
            start = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()
    return {"per_s": n / sum(times), "p50_us": pct(times, 0.5) * 1e6,
            "p99_us": pct(times, 0.99) * 1e6}


# --- the raw loop: the same SQL, one transaction per state change ------------------
def seeded(path: Path, n: int) -> sqlite3.Connection:
    """A fresh broker file holding ``n`` ready jobs, published in one transaction."""
    conn = connect(path)
    conn.executescript(open_schema())
    conn.execute("BEGIN IMMEDIATE")
    for _ in range(n):
        jobs.publish(conn, int(time.time() * 1000), "events", PAYLOAD, 2)
    conn.execute("COMMIT")
    return conn


def raw_loop(path: Path, n: int) -> float:
    conn = seeded(path, n)
    start = time.perf_counter()
    done = 0
    while done < n:
        now = int(time.time() * 1000)
        conn.execute("BEGIN IMMEDIATE")
        [(message, token)] = jobs.claim(conn, now, "events", "raw", 1)
        conn.execute("COMMIT")
        seq = jobs.seq_of(message.id)
        assert seq is not None
        conn.execute("BEGIN IMMEDIATE")
        assert jobs.acknowledge(conn, now, seq, token, 3600)
        conn.execute("COMMIT")
        done += 1
    conn.close()
    return n / (time.perf_counter() - start)


def raw_batched(path: Path, n: int, per_tx: int = 16) -> float:
    """Relay's statements for ``per_tx`` jobs a transaction: lease them; write the
    three ledger rows a ``begin`` writes; write the result and acknowledge."""
    conn = seeded(path, n)
    start = time.perf_counter()
    done = 0
    while done < n:
        now = int(time.time() * 1000)
        conn.execute("BEGIN IMMEDIATE")
        leased = jobs.claim(conn, now, "events", "raw", per_tx)
        conn.execute("COMMIT")
        seqs = [jobs.seq_of(m.id) for m, _ in leased]
        load = LOAD_SQL.format(marks=",".join("?" * len(seqs)))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(load, seqs).fetchall()
        conn.executemany(UPSERT_SQL, [
            row for seq in seqs for row in (
                (seq, "@class", f"matched:fn#{seq}.raw"),
                (seq, FIELD, f"running:{now + 60_000}#1#{seq}.raw"),
                (seq, f"@at:{FIELD}", f"{now}#{seq}.raw"),
            )
        ])
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(load, seqs).fetchall()
        conn.executemany(UPSERT_SQL, [(seq, FIELD, "ok") for seq in seqs])
        conn.executemany(ACK_SQL, [(now + 3_600_000, jobs.seq_of(m.id), token)
                                   for m, token in leased])
        conn.execute("COMMIT")
        done += len(leased)
    conn.close()
    return n / (time.perf_counter() - start)


def thread_cpu_s(name: str) -> float:
    """CPU time (user + system) of this process's live thread called ``name``."""
    ticks = os.sysconf("SC_CLK_TCK")
    for thread in threading.enumerate():
        if thread.name == name and thread.native_id is not None:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            return (int(fields[11]) + int(fields[12])) / ticks
    return 0.0


def open_schema() -> str:
    from relay.adapters.sqlite.broker.store import SCHEMA  # noqa: PLC0415 - one constant

    return SCHEMA


# --- Relay's broker: workers through the adapters ---------------------------------
class Bench:
    def __init__(self, path: Path) -> None:
        self.store = BrokerStore(path, SystemClock())
        self.ledger = SqliteInvocationLedger(self.store)
        self.publisher = SqliteEventPublisher(self.store, "events")
        self.latencies: list[float] = []
        self.done = 0

    def close(self) -> None:
        self.store.close()

    async def publish(self, n: int) -> None:
        for start in range(0, n, 500):
            await self.publisher.publish([(PAYLOAD, None)] * min(500, n - start))

    async def handle(self, stream: SqliteEventStream, message_id: str, leased_at: float) -> None:
        ctx = MessageContext(stream="events", group="relay", consumer=stream.consumer,
                             message_id=message_id, timestamp="")
        token = f"{message_id}.{stream.consumer}"
        claim = ClaimRequest(field=FIELD, max_attempts=3, lease_ms=60_000)
        await self.ledger.begin(BeginRequest(context=ctx, classification="matched:fn",
                                             token=token, claims=(claim,), gates=(FIELD,)))
        report = AttemptReport(field=FIELD, attempt=1, transition=Complete(), error="")
        settled = await self.ledger.finish(FinishRequest(context=ctx, token=token,
                                                         reports=(report,), gates=(FIELD,)))
        assert settled.acknowledged
        self.latencies.append(time.perf_counter() - leased_at)
        self.done += 1

    async def worker(self, name: str, concurrency: int, total: int) -> None:
        """One worker as ``relay start`` runs it: Relay's own ``MessageBuffer`` (read
        for free places only, once half the buffer is free) and ``Dispatchers``
        (long-lived tasks, not one task per job)."""
        stream = SqliteEventStream(self.store, stream="events", group="relay", consumer=name)
        buffer = MessageBuffer(concurrency)
        leased_at: dict[str, float] = {}

        async def dispatch(messages: Sequence[StreamMessage], done: Callable[[str], None]) -> None:
            for message in messages:
                await self.handle(stream, message.id, leased_at.pop(message.id))
                done(message.id)

        async with anyio.create_task_group() as tg:
            workers = Dispatchers(tg, dispatch, buffer)
            batch = max(1, concurrency // 2)
            while self.done < total:
                if not buffer.room(batch):
                    await buffer.wait_free(batch)
                    continue
                with buffer.reserve(buffer.free) as places:
                    got = await stream.read(places.count, 5)
                    now = time.perf_counter()  # the lease is committed: the clock starts
                    for message in got:
                        if places.take(message.id):
                            leased_at[message.id] = now
                            workers.hand([message])  # one job a task, as before
            workers.close()

    async def run(self, workers: int, concurrency: int, total: int) -> None:
        self.done = 0
        async with anyio.create_task_group() as tg:
            for w in range(workers):
                tg.start_soon(self.worker, f"w{w}", concurrency, total)


async def burst(path: Path, n: int) -> dict[str, float]:
    """One timed run: jobs/s, CPU microseconds per job (the event loop's thread,
    the writer thread) and the steps per commit."""
    bench = Bench(path)
    try:
        await bench.publish(n)
        commits, steps = bench.store.commits, bench.store.steps
        writer = thread_cpu_s("relay-broker-writer")
        cpu = time.process_time()
        start = time.perf_counter()
        await bench.run(4, 16, n)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        writer = thread_cpu_s("relay-broker-writer") - writer
        return {"rate": n / elapsed, "writer_us": writer / n * 1e6,
                "loop_us": (cpu - writer) / n * 1e6,
                "per_commit": (bench.store.steps - steps) / max(1, bench.store.commits - commits)}
    finally:
        bench.close()


async def paced(path: Path, n: int, rate: float) -> tuple[float, float]:
    bench = Bench(path)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(bench.run, 4, 16, n)
            start = time.perf_counter()
            for i in range(0, n, 10):  # ten at a time, on a schedule
                await anyio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                await bench.publisher.publish([(PAYLOAD, None)] * 10)
        return pct(bench.latencies, 0.5) * 1e6, pct(bench.latencies, 0.99) * 1e6
    finally:
        bench.close()


async def claimers_64(path: Path, n: int) -> dict[str, float]:
    bench = Bench(path)
    try:
        await bench.publish(n)
        await bench.run(64, 1, n)
    finally:
        bench.close()
    return {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


async def depth_vs_rss(path: Path, seconds: float) -> list[tuple[float, int, float]]:
    """Processing throttled to ``r`` jobs/s (a 4 ms handler, concurrency 4), arrival
    at ``2r``; (time, depth, RSS MiB) each second."""
    bench = Bench(path)
    rate = 4 / 0.004  # four slots, 4 ms each
    samples: list[tuple[float, int, float]] = []

    async def slow_handle(stream: SqliteEventStream, message_id: str, leased_at: float) -> None:
        await anyio.sleep(0.004)
        await Bench.handle(bench, stream, message_id, leased_at)

    bench.handle = slow_handle  # type: ignore[method-assign]
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(bench.run, 1, 4, 10**9)
            start = time.perf_counter()
            published = 0
            next_sample = start
            while time.perf_counter() - start < seconds:
                now = time.perf_counter()
                due = int((now - start) * 2 * rate)
                if due > published:
                    await bench.publisher.publish([(PAYLOAD, None)] * (due - published))
                    published = due
                if now >= next_sample:
                    depth = published - bench.done
                    samples.append((now - start, depth, rss_mib()))
                    next_sample += 1.0
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    finally:
        bench.close()
    return samples


def child(phase: str, directory: Path, arg: float) -> Any:
    """Run one phase in a fresh process (its own RSS); its JSON result."""
    out = subprocess.run(
        [sys.executable, __file__, "--phase", phase, "--dir", str(directory), "--arg", str(arg)],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.splitlines()[-1])


def run_phase(phase: str, directory: Path, arg: float) -> Any:
    path = Path(tempfile.mkdtemp(dir=directory)) / "broker.sqlite3"
    if phase == "claimers":
        return anyio.run(claimers_64, path, int(arg))
    if phase == "depth":
        return anyio.run(depth_vs_rss, path, arg)
    raise SystemExit(f"unknown phase {phase}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--depth-seconds", type=float, default=12.0)
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--phase", default=None)
    parser.add_argument("--arg", type=float, default=0)
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="relay-bench-broker-"))
    base.mkdir(parents=True, exist_ok=True)
    if args.phase:
        print(json.dumps(run_phase(args.phase, base, args.arg)))
        return
    try:
        report(args, base)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


def report(args: argparse.Namespace, base: Path) -> None:

    def fresh() -> Path:
        return Path(tempfile.mkdtemp(dir=base)) / "broker.sqlite3"

    print(f"sqlite {sqlite3.sqlite_version}, synchronous=FULL, WAL, files under {base}")
    fs = fsync_loop(base)
    print(f"fsync (write 4 KiB + os.fsync): {fs['per_s']:,.0f}/s, p50 {fs['p50_us']:.0f} us,"
          f" p99 {fs['p99_us']:.0f} us")
    raws = [raw_loop(fresh(), args.jobs) for _ in range(args.runs)]
    batched = [raw_batched(fresh(), args.jobs) for _ in range(args.runs)]
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
    runs = [anyio.run(burst, fresh(), args.jobs) for _ in range(args.runs)]
    if args.profile:
        profiler.disable()
        profiler.dump_stats(args.profile)
    rates = [r["rate"] for r in runs]
    rate = statistics.median(rates)
    raw, raw_b = statistics.median(raws), statistics.median(batched)
    loop_us = statistics.median(r["loop_us"] for r in runs)
    writer_us = statistics.median(r["writer_us"] for r in runs)
    per_commit = statistics.median(r["per_commit"] for r in runs)
    p50, p99 = anyio.run(paced, fresh(), args.jobs, rate / 2)
    claim = child("claimers", base, args.jobs)
    depth = child("depth", base, args.depth_seconds)
    print()
    print("| figure | value |")
    print("|---|---|")
    print(f"| raw loop, one transaction per change (median of {args.runs}) |"
          f" {raw:,.0f} lease+ACK/s |")
    print(f"| raw loop, Relay's SQL group-committed, 16 jobs a transaction"
          f" (median of {args.runs}) | {raw_b:,.0f} lease+ACK/s |")
    print(f"| Relay broker, 4 workers x 16, {args.jobs} jobs (median of {args.runs}) |"
          f" {rate:,.0f} lease+ACK/s (x{rate / raw:.1f} the raw loop,"
          f" x{rate / raw_b:.2f} the group-committed one) |")
    print(f"| CPU per job (median of {args.runs}): event loop thread + writer thread |"
          f" {loop_us:,.0f} + {writer_us:,.0f} = {loop_us + writer_us:,.0f} us;"
          f" {per_commit:.1f} steps per commit |")
    print(f"| lease+ACK latency at {rate / 2:,.0f} jobs/s | p50 {p50:,.0f} us, p99 {p99:,.0f} us |")
    print(f"| peak RSS, 64 concurrent claimers | {claim['peak_rss_mib']:.1f} MiB |")
    first, last = depth[1], depth[-1]
    growth = last[1] / max(1, first[1])
    change = (last[2] - first[2]) / first[2] * 100
    print(f"| depth {first[1]:,} -> {last[1]:,} (x{growth:.0f}) at 2x arrival | RSS"
          f" {first[2]:.1f} -> {last[2]:.1f} MiB ({change:+.1f}%) |")
    print()
    print("runs: raw " + ", ".join(f"{r:,.0f}" for r in raws)
          + "; raw group-committed " + ", ".join(f"{r:,.0f}" for r in batched)
          + "; relay " + ", ".join(f"{r:,.0f}" for r in rates)
          + "; CPU us/job " + ", ".join(f"{r['loop_us']:.0f}+{r['writer_us']:.0f}" for r in runs))
    print("depth samples (s, depth, RSS MiB): "
          + "; ".join(f"{t:.0f}, {d}, {m:.1f}" for t, d, m in depth))


if __name__ == "__main__":
    main()
