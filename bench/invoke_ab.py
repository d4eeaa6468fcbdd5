"""CPU per warm invocation of ``DockerContainerRuntime.invoke``: old code against new.

    .venv/bin/python bench/invoke_ab.py [--rounds 7] [--invocations 4000]
        [--old-rev REV] [--asyncio] [--only old|new]
        [--cprofile new|old] [--cprofile-out FILE] [--direct]

The OLD side is ``src/relay/adapters/docker/{pool,containers,runtime}.py`` as of
``--old-rev`` (default: the commit before the hot path was slimmed), loaded from
git into a throwaway package; the NEW side is the working tree. Both runtimes
live in this one process, under uvloop (``--asyncio`` for the stock loop), each
with 4 warm containers of a no-op Python handler (image from ``bench/warm.py``,
removed afterwards); ``--direct`` gives every container Relay's own socket, as the
worker does with a local engine (requests and Python's answers then skip the
attach stream). Each round runs ``--invocations`` from 4 concurrent tasks
on one side, then the other (the order alternates), and measures this process's
CPU time (user + system, as ``time.process_time``): it does not depend on what else the machine
is doing, unlike wall time. As in the worker, pool events go to a
``MessageBus`` whose metrics subscribers count them. Prints the per-round figures and the medians.

Not a test: no assertions on the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib
import inspect
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiodocker
import anyio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from warm import build_image  # noqa: E402

from relay.adapters.docker import runtime as new_runtime  # noqa: E402
from relay.adapters.metrics.registry import Metrics  # noqa: E402
from relay.adapters.metrics.subscribers import subscribe  # noqa: E402
from relay.application.bus import MessageBus  # noqa: E402
from relay.domain.execution import InvocationRequest  # noqa: E402

# the last commit before the warm path was slimmed
BASELINE_REV = "80b0100"
MODULES = ("pool", "containers", "runtime")


def load_old(rev: str) -> Any:
    """The runtime module as of ``rev``, importable next to the current one."""
    package = f"_old_docker_{secrets.token_hex(3)}"
    target = Path(tempfile.mkdtemp(prefix="relay-ab-")) / package
    target.mkdir()
    (target / "__init__.py").write_text("")
    for name in MODULES:
        source = subprocess.run(
            ["git", "show", f"{rev}:src/relay/adapters/docker/{name}.py"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for other in MODULES:
            source = source.replace(f"relay.adapters.docker.{other}", f"{package}.{other}")
        (target / f"{name}.py").write_text(source)
    sys.path.insert(0, str(target.parent))
    return importlib.import_module(f"{package}.runtime")


REQUEST = InvocationRequest(
    function="bench", handler="bench.noop", event=b'{"n": 1}', context="1-0"
)


async def run_batch(runtime: Any, invocations: int, tasks: int) -> None:
    async def worker(count: int) -> None:
        for _ in range(count):
            result = await runtime.invoke(REQUEST)
            if not result.ok:
                raise RuntimeError(result.error)

    async with anyio.create_task_group() as tg:
        for _ in range(tasks):
            tg.start_soon(worker, invocations // tasks)


async def main(args: argparse.Namespace, image: str) -> None:
    old_module = load_old(args.old_rev)
    sides = {"old": old_module, "new": new_runtime}
    if args.only:  # one side alone (e.g. under py-spy)
        sides = {args.only: sides[args.only]}
    results: dict[str, list[float]] = {name: [] for name in sides}
    async with aiodocker.Docker() as docker, contextlib.AsyncExitStack() as stack:
        runtimes: dict[str, Any] = {}
        for name, module in sides.items():
            # as in the worker: pool events go to the bus, and metrics count them
            bus = MessageBus({})
            subscribe(bus, Metrics())
            # older runtimes published batches to the bus; newer ones notify it at once
            params = inspect.signature(module.DockerContainerRuntime).parameters
            async def publish(events: Any, bus: MessageBus = bus) -> None:
                for event in events:
                    bus.emit(event)

            wiring: dict[str, Any] = (
                {"publish": publish} if "publish" in params else {"observer": bus.emit}
            )
            if args.direct:
                wiring["direct_dir"] = Path(tempfile.mkdtemp(prefix="relay-ab-")) / "containers"
            runtime = module.DockerContainerRuntime(
                docker,
                hostname=f"bench-ab-{secrets.token_hex(3)}",
                output=lambda _: None,
                **wiring,
            )
            runtimes[name] = await stack.enter_async_context(runtime)
            runtime.activate("bench", image, "python3.14", args.tasks)
            await run_batch(runtime, args.tasks * 50, args.tasks)  # start + warm up
        for round_no in range(args.rounds):
            order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
            for name in order:
                profile = None
                if args.cprofile == name and round_no == args.rounds - 1:
                    profile = cProfile.Profile()
                    profile.enable()
                times, wall = os.times(), time.perf_counter()
                await run_batch(runtimes[name], args.invocations, args.tasks)
                after = os.times()
                wall = time.perf_counter() - wall
                user, system = after.user - times.user, after.system - times.system
                used = user + system  # = time.process_time()'s delta
                if profile is not None:
                    profile.disable()
                    profile.dump_stats(args.cprofile_out)
                per = used / args.invocations * 1e6
                results[name].append(per)
                print(
                    f"round {round_no + 1} {name}: {per:6.1f} us CPU/invocation"
                    f" (user {user / args.invocations * 1e6:5.1f},"
                    f" system {system / args.invocations * 1e6:5.1f};"
                    f" {args.invocations / wall:6.0f} invocations/s wall)"
                )
    loop = "asyncio" if args.asyncio else "uvloop"
    if args.only:
        per = statistics.median(results[args.only])
        print(f"\nmedian over {args.rounds} rounds ({loop}): {args.only} {per:.1f} us")
        return
    old, new = statistics.median(results["old"]), statistics.median(results["new"])
    print(
        f"\nmedian over {args.rounds} rounds ({loop}, {args.tasks} tasks, "
        f"{args.tasks} warm containers): old {old:.1f} us, new {new:.1f} us CPU per "
        f"invocation => new/old {new / old:.2f} ({old - new:+.1f} us saved)"
    )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--invocations", type=int, default=4000)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--old-rev", default=BASELINE_REV)
    parser.add_argument("--asyncio", action="store_true", help="the stock loop, not uvloop")
    parser.add_argument("--direct", action="store_true", help="Relay's socket per container")
    parser.add_argument("--only", choices=("old", "new"), default=None, help="one side alone")
    parser.add_argument("--cprofile", choices=("old", "new"), default=None)
    parser.add_argument("--cprofile-out", default="/tmp/relay-invoke-ab.prof")
    args = parser.parse_args()
    image = build_image()
    try:
        anyio.run(
            main,
            args,
            image,
            backend_options={} if args.asyncio else {"use_uvloop": True},
        )
    finally:
        subprocess.run(["docker", "rmi", "-f", image], check=False, capture_output=True)


if __name__ == "__main__":
    cli()
