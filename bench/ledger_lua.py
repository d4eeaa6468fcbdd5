"""Redis's own time per ledger script call: the working tree's Lua against a baseline's.

    .venv/bin/python bench/ledger_lua.py [--baseline REV] [--calls 20000] [--rounds 5]
                                         [--url URL]

The ``begin`` and ``finish`` scripts of the working tree and of ``--baseline`` (read
from git: ``src/relay/adapters/redis/lua/`` at that commit, with today's generated
constants prepended, which older scripts ignore) run on the same throwaway Redis
(see ``_redisbench.throwaway_redis``) for one fresh message each call, as a first
delivery does: ``begin`` claims one invocation, ``finish`` records its success and
acknowledges. The figure is ``usec_per_call`` of ``INFO commandstats`` for EVALSHA:
the time Redis itself spent in the script and the commands it ran, which is what
the scripts cost the machine whatever the client does. Rounds alternate the order
of the two sides; the table shows each side's median and minimum.

The argument layout is today's; a baseline from before 2026-11 takes one argument
fewer for each script and ignores the extra one. Prints figures only.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _redisbench import throwaway_redis

from relay.adapters.redis.ledger import constants_source, script_source

ROOT = Path(__file__).resolve().parents[1]
LUA = "src/relay/adapters/redis/lua"
FS = "\x1f"
FIELD = "fn/handler"
Args = Callable[[int], tuple[list[str], list[str]]]


def baseline_source(rev: str, name: str) -> str:
    def show(file: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:{LUA}/{file}.lua"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    return constants_source() + show("common") + "\n" + show(name)


def header(i: int) -> str:
    return FS.join(["relay", "bench", f"{i}-0", "2026-01-01T00:00:00Z", "172800", "0"])


def begin_args(i: int) -> tuple[list[str], list[str]]:
    claims = FS.join([FIELD, "5", "60000"])
    return [f"L{i}", "S", "D"], [header(i), "matched:fn", "tok", claims, FIELD, ""]


def finish_args(i: int) -> tuple[list[str], list[str]]:
    report = FS.join([FIELD, "1", "ok", ""])
    return [f"L{i}", "S", "D"], [header(i), "tok", report, FIELD, "", ""]


def usec_per_call(client: redis.Redis, sha: str, args: Args, calls: int, first: int) -> float:
    client.config_resetstat()
    pipe = client.pipeline(transaction=False)
    for i in range(first, first + calls):
        keys, argv = args(i)
        pipe.evalsha(sha, len(keys), *keys, *argv)
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()
    stats = client.info("commandstats")["cmdstat_evalsha"]
    return float(stats["usec_per_call"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="5e64902", help="commit of the old scripts")
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", default=None)
    args = parser.parse_args()
    sides = {
        f"baseline {args.baseline}": {
            n: baseline_source(args.baseline, n) for n in ("begin", "finish")
        },
        "working tree": {n: script_source(n) for n in ("begin", "finish")},
    }
    figures: dict[tuple[str, str], list[float]] = {
        (s, n): [] for s in sides for n in ("begin", "finish")
    }
    with throwaway_redis(args.url) as url:
        client = redis.Redis.from_url(url)
        first = 0
        for round_no in range(args.rounds):
            order = list(sides.items())
            if round_no % 2:
                order.reverse()
            for side, sources in order:
                client.flushall()
                for name, call_args in (("begin", begin_args), ("finish", finish_args)):
                    sha = client.script_load(sources[name])
                    figures[(side, name)].append(
                        usec_per_call(client, sha, call_args, args.calls, first)
                    )
                first += args.calls
        client.close()
    print(f"Redis time per script call (usec, INFO commandstats), {args.rounds} rounds")
    print(f"{'':28s}{'median':>8s}{'min':>8s}  rounds")
    for (side, name), values in figures.items():
        rounds = " ".join(f"{v:.1f}" for v in values)
        print(
            f"{side + ' ' + name:28s}{statistics.median(values):8.2f}{min(values):8.2f}  {rounds}"
        )


if __name__ == "__main__":
    main()
