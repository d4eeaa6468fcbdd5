"""Relay end to end, the working tree against a baseline revision, in one run.

    .venv/bin/python bench/relay_ab.py [--baseline-rev REV] [--tree-rev REV]
                                       [--events 10000] [--pairs 10] [--redis-url URL]

Two real ``relay start`` workers, both warm, share one throwaway Redis (as in
``bench/throughput.py``): the baseline, whose ``src`` is ``REV`` (``git archive``,
default ``HEAD``: the last commit, so uncommitted changes are what is measured)
put first on ``PYTHONPATH``, and the working tree (or ``--tree-rev``'s ``src``, put
there the same way). Both run from this venv, so the
libraries are the same on both sides. Each has its own no-op Python function,
stream, state and run directories, and MAX_CONCURRENCY=4 (four warm containers).

Then ``--pairs`` pairs of bursts of ``--events`` XADDs, one worker at a time,
the order alternating: each burst is timed until everything is acknowledged.
The other worker is idle meanwhile. Consecutive bursts see nearly the same
machine, so the ratio within a pair is far steadier than two separate runs of
``bench/throughput.py`` on a noisy machine. The table prints every pair and the
medians. Read the spread too: ``--baseline-rev HEAD`` with a clean tree measures
the harness against itself (two runs here: medians 1.004 and 1.012, pairs 0.75
to 1.25).

Not a test: no assertions on the figures.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _redisbench
from _redisbench import (
    Worker,
    add_burst,
    remove_function_images,
    start_noop_worker,
    throwaway_redis,
    wait_acked,
    warm_up,
    workdir,
)

ROOT = Path(__file__).resolve().parents[1]
GROUP = "relay-ab"


@dataclass
class Side:
    label: str
    worker: Worker
    function: str
    stream: str
    rates: list[float]


@contextmanager
def source_of(rev: str) -> Iterator[Path]:
    """``rev``'s ``src`` directory, extracted into a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="relay-ab-") as tmp:
        archive = subprocess.run(
            ["git", "archive", rev, "src"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        yield Path(tmp) / "src"


def start_side(label: str, url: str, root: Path, pythonpath: Path | None) -> Side:
    """A warm-up-ready worker; ``pythonpath``: the ``src`` it runs, else the venv's."""
    suffix = secrets.token_hex(3)
    function = stream = f"bench-ab-{label}-{suffix}"
    home = root / label
    home.mkdir()
    worker = start_noop_worker(
        url=url,
        stream=stream,
        group=GROUP,
        root=home,
        function=function,
        name=f"bench-ab-{label}",
        concurrency=4,
        # first on the worker's path: its relay package is that source, not the venv's
        extra_env={"PYTHONPATH": str(pythonpath)} if pythonpath is not None else None,
    )
    return Side(label, worker, function, stream, [])


async def burst(client: Redis, side: Side, events: int, first_seq: int) -> None:
    began = time.monotonic()
    last = await add_burst(client, side.stream, events, first_seq=first_seq)
    done = await wait_acked(client, side.stream, GROUP, last, 600, side.worker.alive)
    side.rates.append(events / (done - began))
    await client.xtrim(side.stream, maxlen=0)  # the next burst starts on an empty stream


async def run(url: str, baseline: Path, tree: Path | None, events: int, pairs: int) -> None:
    client = Redis.from_url(url, decode_responses=True)
    with workdir() as root:
        sides = [start_side("base", url, root, baseline), start_side("tree", url, root, tree)]
        try:
            for side in sides:
                print(f"{side.label}: starting the worker and building {side.function}")
                await warm_up(client, side.stream, GROUP, side.worker, 600)
            base, tree = sides
            print(f"\n{'pair':>4}  {'baseline ev/s':>13}  {'tree ev/s':>9}  tree/baseline")
            for n in range(pairs):
                order = sides if n % 2 == 0 else sides[::-1]
                for side in order:
                    await burst(client, side, events, 1_000_000 * (n + 1))
                ratio = tree.rates[-1] / base.rates[-1]
                print(f"{n + 1:>4}  {base.rates[-1]:>13,.0f}  {tree.rates[-1]:>9,.0f}  {ratio:.3f}")
            ratios = [t / b for t, b in zip(tree.rates, base.rates, strict=True)]
            print(
                f"median {statistics.median(base.rates):>11,.0f}  "
                f"{statistics.median(tree.rates):>9,.0f}  {statistics.median(ratios):.3f}"
                f"  (pairs {min(ratios):.2f} to {max(ratios):.2f})"
            )
        except BaseException:
            for side in sides:
                print(f"--- {side.label} worker log (tail) ---\n{side.worker.log_tail()}")
            raise
        finally:
            for side in sides:
                side.worker.stop()
                remove_function_images(side.function)
            await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline-rev", default="HEAD")
    parser.add_argument("--tree-rev", default=None, help="a revision instead of the working tree")
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    tree_label = args.tree_rev or "the working tree"
    print(f"relay_ab: baseline {args.baseline_rev} against {tree_label}; {_redisbench.RELAY}")
    with ExitStack() as stack:
        base = stack.enter_context(source_of(args.baseline_rev))
        tree = stack.enter_context(source_of(args.tree_rev)) if args.tree_rev else None
        url = stack.enter_context(throwaway_redis(args.redis_url))
        anyio.run(run, url, base, tree, args.events, args.pairs)


if __name__ == "__main__":
    main()
