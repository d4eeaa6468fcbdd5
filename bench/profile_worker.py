"""Where a handled event's CPU goes: a real ``relay start`` under sustained load.

    .venv/bin/python bench/profile_worker.py [--events 20000] [--rounds 3]
        [--py-spy top|record] [--py-spy-out FILE] [--redis-url URL]

Same set-up as ``bench/throughput.py`` (throwaway Redis, a no-op Python handler,
MAX_CONCURRENCY=4 so four warm containers, LOG_LEVEL=WARN), then ``--rounds``
bursts of ``--events``. For each burst it prints events/s and, from /proc, the
CPU time per event of every process name on the machine (the worker itself,
dockerd, containerd shims, Redis, the handlers' bootstraps...), so the cost of
the Docker attach path shows next to Relay's own. With ``--py-spy`` it samples
the worker during the last burst (``pip install py-spy`` locally; it is not a
project dependency): ``top`` prints the hottest functions, ``record`` writes a
flame graph (``--py-spy-out``, default /tmp/relay-worker.svg).

Not a test: figures vary with the machine and its load (other processes show
up in the table too; read the worker, dockerd, containerd-shim and redis rows).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import _redisbench
import anyio
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _redisbench import (
    add_burst,
    command_counts,
    delta,
    percentile,
    remove_function_images,
    settle_latency,
    start_noop_worker,
    throwaway_redis,
    wait_acked,
    warm_up,
    workdir,
)
from warm import build_image, warm

TICK = os.sysconf("SC_CLK_TCK")


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """pid -> (name, CPU seconds so far) for every process on the machine."""
    out: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if _in_container(entry):
            name = f"container: {name}"
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry)] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def worker_user_system(pid: int) -> tuple[float, float]:
    """The worker's user and system CPU seconds so far."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def _in_container(pid: str) -> bool:
    """Inside a Docker container (the handlers' bootstraps, a containerised Redis)."""
    try:
        with open(f"/proc/{pid}/cgroup") as handle:
            return "docker" in handle.read()
    except OSError:
        return False


def cpu_delta(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], worker: int
) -> dict[str, float]:
    by_name: dict[str, float] = defaultdict(float)
    for pid, (name, seconds) in after.items():
        used = seconds - before.get(pid, (name, 0.0))[1]
        if used > 0:
            by_name["relay worker" if pid == worker else name] += used
    return by_name


async def run(args: argparse.Namespace, url: str) -> None:
    suffix = secrets.token_hex(3)
    function = f"bench-prof-{suffix}"
    stream, group = f"bench-prof-{suffix}", "relay-prof"
    client = Redis.from_url(url, decode_responses=True)
    with workdir() as root:
        worker = start_noop_worker(
            url=url,
            stream=stream,
            group=group,
            root=root,
            function=function,
            name="prof-worker",
            concurrency=args.concurrency,
        )
        try:
            print(f"starting the worker (pid {worker.proc.pid}) and building {function}")
            await warm_up(client, stream, group, worker, args.build_timeout)
            for round_no in range(1, args.rounds + 1):
                spy = None
                if args.py_spy and round_no == args.rounds:
                    spy = start_py_spy(args, worker.proc.pid)
                commands_before = await command_counts(client)
                cpu_before = cpu_by_process()
                load = os.getloadavg()[0]
                started = time.monotonic()
                last = await add_burst(client, stream, args.events, first_seq=round_no * 10**7)
                finished = await wait_acked(client, stream, group, last, 600, worker.alive)
                cpu_after = cpu_by_process()
                commands = delta(commands_before, await command_counts(client))
                seconds = finished - started
                print(
                    f"\nround {round_no}: {args.events / seconds:.0f} events/s "
                    f"({seconds:.2f}s, load average {load:.2f} before), "
                    f"{sum(commands.values()) / args.events:.2f} Redis commands/event"
                )
                used = cpu_delta(cpu_before, cpu_after, worker.proc.pid)
                total = sum(used.values())
                print(f"  CPU busy {total / seconds:.2f} of {os.cpu_count()} cores; per event:")
                user, system = worker_user_system(worker.proc.pid)
                print(
                    f"    (the worker so far: {user:.1f} s user, {system:.1f} s system: "
                    f"{100 * system / max(user + system, 1e-9):.0f}% in the kernel)"
                )
                for name, secs in sorted(used.items(), key=lambda kv: -kv[1])[:14]:
                    print(f"    {name:24} {secs / args.events * 1e6:8.1f} us")
                if spy is not None:
                    finish_py_spy(spy, args)
            for rate in args.latency_rates:
                cpu_before = cpu_by_process()
                started = time.monotonic()
                run_ = await settle_latency(url, stream, group, rate, args.latency_events)
                seconds = time.monotonic() - started
                used = cpu_delta(cpu_before, cpu_by_process(), worker.proc.pid)
                lat = run_.latencies_ms
                if lat:
                    print(
                        f"\nXADD->XACK at {rate:.0f} events/s: p50 {percentile(lat, 0.5):.2f} ms, "
                        f"p99 {percentile(lat, 0.99):.2f} ms ({len(lat)} events)"
                    )
                # this process is the producer and the probe: its share is the harness's
                print(f"  CPU busy {sum(used.values()) / seconds:.2f} of {os.cpu_count()} cores:")
                for name, secs in sorted(used.items(), key=lambda kv: -kv[1])[:8]:
                    print(f"    {name:24} {secs / seconds * 100:6.1f} % of a core")
        except BaseException:
            print("--- worker log (tail) ---")
            print(worker.log_tail())
            raise
        finally:
            worker.stop()
            remove_function_images(function)
            await client.delete(stream, f"relay:{stream}:dlq")
            await client.aclose()


def start_py_spy(args: argparse.Namespace, pid: int) -> subprocess.Popen[bytes]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    # --gil: only the thread holding the GIL, i.e. where the worker's Python time goes
    command = [
        spy,
        "record",
        "-p",
        str(pid),
        "-o",
        args.py_spy_out,
        "-r",
        "97",
        "--gil",
        "--nonblocking",
    ]
    svg = args.py_spy == "record" and args.py_spy_out.endswith(".svg")
    command += ["-f", "flamegraph" if svg else "raw"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish_py_spy(spy: subprocess.Popen[bytes], args: argparse.Namespace) -> None:
    spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
    spy.wait(timeout=60)
    if args.py_spy == "top":
        print_top(Path(args.py_spy_out))
    else:
        print(f"  py-spy flame graph: {args.py_spy_out}")


def print_top(raw: Path, limit: int = 30) -> None:
    """Self and total sample shares per function from py-spy's collapsed stacks."""
    own: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = stack.split(";")
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    print(f"  py-spy: {samples} samples; hottest by own time (own%, total%):")
    for frame, count in sorted(own.items(), key=lambda kv: -kv[1])[:limit]:
        print(f"    {100 * count / samples:5.1f} {100 * total[frame] / samples:5.1f}  {frame}")


async def runtime_only(args: argparse.Namespace) -> None:
    """The warm path alone (bench/warm.py's set-up), CPU per invocation by process."""
    image = await anyio.to_thread.run_sync(build_image)
    try:
        await warm(image, 4, 400)  # image layers cached, containers tried once
        for round_no in range(1, args.rounds + 1):
            profile = cProfile.Profile() if args.cprofile and round_no == args.rounds else None
            cpu_before, own_before = cpu_by_process(), time.process_time()
            if profile is not None:
                profile.enable()
            rate, latencies, _ = await warm(image, 4, args.events)
            if profile is not None:
                profile.disable()
                profile.dump_stats(args.cprofile)
            own = time.process_time() - own_before
            used = cpu_delta(cpu_before, cpu_by_process(), os.getpid())
            latencies.sort()
            print(
                f"\nround {round_no}: {rate:.0f} invocations/s, p50 "
                f"{latencies[len(latencies) // 2] * 1e3:.2f} ms; this process "
                f"{own / args.events * 1e6:.0f} us CPU per invocation (incl. container start)"
            )
            for name, secs in sorted(used.items(), key=lambda kv: -kv[1])[:8]:
                print(f"    {name:24} {secs / args.events * 1e6:8.1f} us")
    finally:
        await anyio.run_process(["docker", "rmi", "-f", image], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--concurrency", type=int, default=4, help="MAX_CONCURRENCY = warm containers"
    )
    parser.add_argument("--py-spy", choices=("top", "record"), default=None)
    parser.add_argument("--py-spy-out", default="/tmp/relay-worker.txt")
    parser.add_argument(
        "--latency-rates",
        type=float,
        nargs="*",
        default=[],
        help="after the bursts, XADD->XACK p50/p99 at each of these paced rates",
    )
    parser.add_argument("--latency-events", type=int, default=1000)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument("--build-timeout", type=float, default=600.0)
    parser.add_argument(
        "--runtime-only",
        action="store_true",
        help="no Redis, no worker: DockerContainerRuntime.invoke from 4 tasks in this process",
    )
    parser.add_argument(
        "--cprofile",
        default=None,
        help="pstats file: profile the worker (or, with --runtime-only, this process)",
    )
    args = parser.parse_args()
    if args.runtime_only:
        anyio.run(runtime_only, args)
        return
    if args.py_spy == "record" and args.py_spy_out == "/tmp/relay-worker.txt":
        args.py_spy_out = "/tmp/relay-worker.svg"
    if args.cprofile:
        # the worker under cProfile (slower; for call counts and relative cost)
        wrapper = Path(tempfile.mkdtemp(prefix="relay-prof-")) / "relay"
        wrapper.write_text(
            f"#!{sys.executable}\nimport cProfile, sys\n"
            "from relay.entrypoints.cli import main\n"
            "profile = cProfile.Profile()\nprofile.enable()\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            f"profile.disable()\nprofile.dump_stats({args.cprofile!r})\n"
        )
        wrapper.chmod(0o755)
        _redisbench.RELAY = str(wrapper)
    with throwaway_redis(args.redis_url) as url:
        anyio.run(run, args, url)


if __name__ == "__main__":
    main()
