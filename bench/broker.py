"""The embedded broker's evidence (issue 29), measured in one run on this machine.

    .venv/bin/python bench/broker.py [--jobs 5000] [--runs 3] [--dir DIR]
                                     [--depth-seconds 12] [--profile FILE]
                                     [--limit-tool ../shared/tools/sqlite_queue_limit.py]
                                     [--switch-interval SECONDS]

Every figure is with ``synchronous=FULL`` in WAL mode, on a file in ``--dir``
(default: a new temporary directory). It prints, each beside what it is judged
against in the same run:

- **fsync**: a timed ``write(4 KiB) + os.fsync`` loop on that disk (its p99 is
  the yardstick of the latency goal: lease-to-ACK p99 at most 3x it);
- **sqlite_queue_limit.py**'s 64-jobs-a-transaction lease+ACK/s, run here (the
  throughput goal: at least 12,000/s, or at least a quarter of that figure);
- **raw loop**: the broker's SQL, one transaction per state change, no Relay
  code; and **raw loop, two transactions**: Relay's statements for 16 jobs in the
  broker's two transactions per job (lease + claim, then result + ACK);
- **Relay broker**: 4 workers at concurrency 16 through Relay's own adapters,
  batched as the batched dispatcher runs them: each worker reads up to its free
  places (a read only peeks), ``begin_many`` leases and claims the whole batch
  in one transaction, the attempts run (no-ops), and ``finish_many`` records the
  results and acknowledges in a second; a worker reads again once half its
  places are free, so two batches are in flight. Jobs/s (``--jobs`` per run,
  ``--runs`` runs, medians), CPU time per job of the event loop's thread, of the
  readers' worker threads and of the writer thread (each with the SQLite work it
  does; the writer's with its commits), steps per commit; then p50/p99
  from the read to the acknowledgment's commit with jobs arriving at half the
  median rate;
- **64 claimers**: the peak RSS of a process whose 64 concurrent claimers run
  the same jobs (``ru_maxrss``, its own process);
- **depth vs RSS**: arrival at twice the processing rate; the queue depth and
  the process's RSS, sampled each second (the goal: flat within 10% as the
  depth grows tenfold: give ``--depth-seconds`` enough for a tenfold growth
  after the first sample, 12 s or more).

``--switch-interval`` sets the interpreter's GIL switch interval for the whole run
(default: Python's, 5 ms): the three threads share one GIL, and a thread that
let go of it for a system call (the writer's every statement, its fsync, its
wake-up of the loop) may wait up to that long to get it back from a busy one.
Comparing ``0.005`` with ``0.0005`` in one window shows how much of the latency
and of the writer's wall time is that wait.

Each state change is committed before its caller learns of it: the broker's
writer thread answers only after ``COMMIT``; concurrent steps share one
transaction (group commit). A read writes nothing.
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
    """Relay's statements for ``per_tx`` jobs a transaction, in the broker's two
    transactions per job: lease them (one statement) and write the three ledger
    rows a ``begin`` writes; then write the result and acknowledge them."""
    conn = seeded(path, n)
    start = time.perf_counter()
    done = 0
    while done < n:
        now = int(time.time() * 1000)
        conn.execute("BEGIN IMMEDIATE")
        leased = jobs.claim(conn, now, "events", "raw", per_tx)
        seqs = [jobs.seq_of(m.id) for m, _ in leased]
        load = LOAD_SQL.format(marks=",".join("?" * len(seqs)))
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


def queue_limit(tool: Path, directory: Path, n: int) -> dict[str, float]:
    """``sqlite_queue_limit.py``'s figures in this run (its own fsync p99 and its
    64-jobs-a-transaction lease+ACK/s), or an empty dict when it is not there."""
    if not tool.is_file():
        return {}
    out = subprocess.run(
        [sys.executable, str(tool), "--jobs", str(n), "--batches", "64", "--dir", str(directory)],
        check=True, capture_output=True, text=True,
    ).stdout
    figures: dict[str, float] = {}
    for line in out.splitlines():
        if line.startswith("fsync:"):
            figures["fsync_p99_ms"] = float(line.rsplit("p99 ", 1)[1].split()[0])
        elif "64 jobs a transaction" in line:
            figures["rate_64"] = float(line.split(": ", 1)[1].split()[0].replace(",", ""))
    return figures


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
        self.lost = 0
        self.handler_s = 0.0  # what each batch's attempts take (all concurrently)

    def close(self) -> None:
        self.store.close()

    async def publish(self, n: int) -> None:
        for start in range(0, n, 500):
            await self.publisher.publish([(PAYLOAD, None)] * min(500, n - start))

    async def batch(self, consumer: str, got: list[StreamMessage], read_at: float) -> None:
        """One batch as the batched dispatcher runs it: every member begun in one
        ledger call (the lease and the claim: one transaction), attempted
        concurrently (a no-op here), and settled in one ``finish_many`` (the
        results and the acknowledgments: the second transaction)."""
        claim = ClaimRequest(field=FIELD, max_attempts=3, lease_ms=60_000)
        ctxs = [MessageContext(stream="events", group="relay", consumer=consumer,
                               message_id=m.id, timestamp="", delivery=m.delivery) for m in got]
        begun = await self.ledger.begin_many([
            BeginRequest(context=ctx, classification="matched:fn", token=f"{ctx.message_id}.t",
                         claims=(claim,), gates=(FIELD,))
            for ctx in ctxs
        ])
        held = [ctx for ctx, result in zip(ctxs, begun, strict=True) if not result.lost]
        self.lost += len(ctxs) - len(held)
        if self.handler_s:
            await anyio.sleep(self.handler_s)
        report = AttemptReport(field=FIELD, attempt=1, transition=Complete(), error="")
        settled = await self.ledger.finish_many([
            FinishRequest(context=ctx, token=f"{ctx.message_id}.t", reports=(report,),
                          gates=(FIELD,))
            for ctx in held
        ])
        assert all(s.acknowledged for s in settled)
        now = time.perf_counter()
        self.latencies.extend(now - read_at for _ in held)
        self.done += len(held)

    async def worker(self, name: str, concurrency: int, total: int) -> None:
        """One worker: reads for its free places once half of them are free (so two
        batches are in flight: one beginning while the other finishes), each read
        a batch of its own."""
        stream = SqliteEventStream(self.store, stream="events", group="relay", consumer=name)
        free = concurrency
        freed = anyio.Event()

        async def run(got: list[StreamMessage], read_at: float) -> None:
            nonlocal free, freed
            try:
                await self.batch(name, got, read_at)
            finally:
                free += len(got)
                freed.set()
                freed = anyio.Event()

        async with anyio.create_task_group() as tg:
            while self.done < total:
                if free < max(1, concurrency // 2):
                    with anyio.move_on_after(0.05):
                        await freed.wait()
                    continue
                got = list(await stream.read(free, 5))
                if got:
                    free -= len(got)
                    tg.start_soon(run, got, time.perf_counter())

    async def run(self, workers: int, concurrency: int, total: int) -> None:
        self.done = 0
        async with anyio.create_task_group() as tg:
            for w in range(workers):
                tg.start_soon(self.worker, f"w{w}", concurrency, total)


async def burst(path: Path, n: int) -> dict[str, float]:
    """One timed run: jobs/s, CPU microseconds per job of each thread kind (the
    event loop's, the writer's, the readers' worker threads: the rest of the
    process) and the steps per commit."""
    bench = Bench(path)
    try:
        await bench.publish(n)
        commits, steps = bench.store.commits, bench.store.steps
        writer = thread_cpu_s("relay-broker-writer")
        cpu, loop = time.process_time(), time.thread_time()  # this thread runs the loop
        start = time.perf_counter()
        await bench.run(4, 16, n)
        elapsed = time.perf_counter() - start
        cpu, loop = time.process_time() - cpu, time.thread_time() - loop
        writer = thread_cpu_s("relay-broker-writer") - writer
        return {"rate": n / elapsed, "writer_us": writer / n * 1e6, "loop_us": loop / n * 1e6,
                "readers_us": max(0.0, cpu - writer - loop) / n * 1e6,
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
    """Processing throttled to ``r`` jobs/s (each batch's attempts take 4 ms, 4
    places), arrival at ``2r``; (time, depth, RSS MiB) each second."""
    bench = Bench(path)
    bench.handler_s = 0.004
    rate = 4 / 0.004
    samples: list[tuple[float, int, float]] = []
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
    parser.add_argument("--limit-tool", type=Path,
                        default=REPO.parent / "shared" / "tools" / "sqlite_queue_limit.py")
    parser.add_argument("--switch-interval", type=float, default=None)
    parser.add_argument("--phase", default=None)
    parser.add_argument("--arg", type=float, default=0)
    args = parser.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
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

    print(f"sqlite {sqlite3.sqlite_version}, synchronous=FULL, WAL, files under {base},"
          f" GIL switch interval {sys.getswitchinterval() * 1000:g} ms")
    fs = fsync_loop(base)
    print(f"fsync (write 4 KiB + os.fsync): {fs['per_s']:,.0f}/s, p50 {fs['p50_us']:.0f} us,"
          f" p99 {fs['p99_us']:.0f} us")
    limit = queue_limit(args.limit_tool, base, max(args.jobs, 5000))
    raws = [raw_loop(fresh(), min(args.jobs, 2000)) for _ in range(args.runs)]
    batched = [raw_batched(fresh(), args.jobs) for _ in range(args.runs)]
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
    runs = [anyio.run(burst, fresh(), args.jobs) for _ in range(args.runs)]
    if args.profile:
        profiler.disable()
        profiler.dump_stats(args.profile)
    rate = statistics.median(r["rate"] for r in runs)
    p50, p99 = anyio.run(paced, fresh(), args.jobs, rate / 2)
    figures = {
        "fsync": fs, "limit": limit, "raw": statistics.median(raws),
        "raw_b": statistics.median(batched), "rate": rate, "p50": p50, "p99": p99,
        "claim": child("claimers", base, args.jobs),
        "depth": child("depth", base, args.depth_seconds),
    }
    print_table(args, runs, figures)
    print()
    print("runs: raw " + ", ".join(f"{r:,.0f}" for r in raws)
          + "; raw group-committed " + ", ".join(f"{r:,.0f}" for r in batched)
          + "; relay " + ", ".join(f"{r['rate']:,.0f}" for r in runs)
          + "; CPU us/job (loop+readers+writer) "
          + ", ".join(f"{r['loop_us']:.0f}+{r['readers_us']:.0f}+{r['writer_us']:.0f}"
                      for r in runs))
    print("depth samples (s, depth, RSS MiB): "
          + "; ".join(f"{t:.0f}, {d}, {m:.1f}" for t, d, m in figures["depth"]))


def print_table(args: argparse.Namespace, runs: list[dict[str, float]], f: dict[str, Any]) -> None:
    """The issue's figures, each beside the one it is judged against (same run)."""
    rate, limit, n = f["rate"], f["limit"], args.runs
    loop_us = statistics.median(r["loop_us"] for r in runs)
    readers_us = statistics.median(r["readers_us"] for r in runs)
    writer_us = statistics.median(r["writer_us"] for r in runs)
    per_commit = statistics.median(r["per_commit"] for r in runs)
    print()
    print("| figure | value |")
    print("|---|---|")
    print(f"| raw loop, one transaction per change (median of {n}) | {f['raw']:,.0f} lease+ACK/s |")
    print(f"| raw loop, Relay's SQL in its two transactions, 16 jobs each (median of {n}) |"
          f" {f['raw_b']:,.0f} lease+ACK/s |")
    if limit:
        print(f"| sqlite_queue_limit.py, 64 jobs a transaction (this run) |"
              f" {limit['rate_64']:,.0f} lease+ACK/s (a quarter: {limit['rate_64'] / 4:,.0f}) |")
    goal = " (goal >= 12,000"
    if limit:
        goal += f", or >= x0.25 the 64-job figure: here x{rate / limit['rate_64']:.2f} of it"
    goal += ")"
    print(f"| **Relay broker**, 4 workers x 16, batched, {args.jobs} jobs (median of {n}) |"
          f" **{rate:,.0f} lease+ACK/s**{goal} |")
    print(f"| CPU per job (median of {n}): event loop thread + readers' threads + writer"
          f" thread (goal: well under 50 us of Python per job per thread) |"
          f" {loop_us:,.0f} + {readers_us:,.0f} + {writer_us:,.0f}"
          f" = {loop_us + readers_us + writer_us:,.0f} us; {per_commit:.1f} steps per commit |")
    fsync_p99 = f["fsync"]["p99_us"]
    print(f"| lease-to-ACK latency at half rate ({rate / 2:,.0f} jobs/s) | p50 {f['p50']:,.0f} us,"
          f" **p99 {f['p99']:,.0f} us** = x{f['p99'] / fsync_p99:.1f} the fsync p99"
          f" ({fsync_p99:,.0f} us; goal <= x3) |")
    print(f"| peak RSS, 64 concurrent claimers | {f['claim']['peak_rss_mib']:.1f} MiB |")
    depth = f["depth"]
    first, last = depth[1], depth[-1]
    growth = last[1] / max(1, first[1])
    change = (last[2] - first[2]) / first[2] * 100
    print(f"| depth {first[1]:,} -> {last[1]:,} (x{growth:.0f}) at 2x arrival | RSS"
          f" {first[2]:.1f} -> {last[2]:.1f} MiB (**{change:+.1f}%**; goal within 10%"
          f" over a tenfold depth) |")


if __name__ == "__main__":
    main()
