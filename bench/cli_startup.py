"""How fast ``relay`` answers: wall time of whole commands beside bare Python.

    .venv/bin/python bench/cli_startup.py [--runs 21] [--events 1000]

Each round runs, in a shuffled order, ``python -c pass`` (the floor: the same
interpreter starting and exiting), ``relay --version``, ``relay --help``,
``relay publish`` of one event to the embedded broker (a fresh file in a temporary
directory, created by the first run), ``relay function ls --json`` (an empty state
directory) and ``relay publish`` of ``--events`` events from stdin in one process.
Interleaving the commands within each round spreads the machine's load over all
of them alike. Prints, per command, the median, min and max wall time in seconds
over ``--runs`` rounds, the median's ratio to the floor's, and the median CPU time
(user + system, of the child) beside it, then whether each of the four startup
commands meets the goal of issue 30 (a median wall time of at most 0.25 s).

Bytecode is cached as for an installed ``relay`` (under the temporary directory,
whatever ``PYTHONDONTWRITEBYTECODE`` says). Figures are machine-dependent and
only mean something on a quiet machine; the
ratios to ``python -c pass`` from the same run travel better than the seconds,
and CPU time is less disturbed by other processes than wall time.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

GOAL_S = 0.25
PYTHON = sys.executable
RELAY = str(Path(PYTHON).with_name("relay"))


@dataclass(frozen=True)
class Command:
    name: str
    argv: list[str]
    stdin: bytes = b""
    startup: bool = True  # one of the commands the 0.25 s goal is about


def commands(events: int) -> list[Command]:
    lines = b"".join(b'{"n": %d}\n' % n for n in range(events))
    return [
        Command("python -c pass", [PYTHON, "-c", "pass"], startup=False),
        Command("relay --version", [RELAY, "--version"]),
        Command("relay --help", [RELAY, "--help"]),
        Command("relay publish (embedded)", [RELAY, "publish", "--event", '{"n": 0}']),
        Command("relay function ls --json", [RELAY, "function", "ls", "--json"]),
        Command(f"relay publish {events} from stdin", [RELAY, "publish"], lines, startup=False),
    ]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(command: Command, env: Mapping[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run (runs are sequential: the CPU delta is its)."""
    cpu, start = _children_cpu(), time.perf_counter()
    done = subprocess.run(command.argv, input=command.stdin, env=dict(env),
                          capture_output=True, check=False)  # fmt: skip
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{command.name} failed ({done.returncode}): {done.stderr.decode()[-400:]}")
    return elapsed, _children_cpu() - cpu


Times = dict[str, list[tuple[float, float]]]


def measure(runs: int, events: int, env: Mapping[str, str]) -> Times:
    cmds = commands(events)
    times: Times = {c.name: [] for c in cmds}
    rng = random.Random(30)
    for command in cmds:  # one warm-up each: byte-compile, create the broker file
        run_once(command, env)
    for _ in range(runs):
        for command in rng.sample(cmds, len(cmds)):
            times[command.name].append(run_once(command, env))
    return times


def report(times: Times, events: int) -> None:
    floor = statistics.median(wall for wall, _ in times["python -c pass"])
    print(f"{'command':34} {'median':>8} {'min':>8} {'max':>8} {'x pass':>8} {'cpu':>8}")
    for name, runs in times.items():
        walls = [wall for wall, _ in runs]
        median, cpu = statistics.median(walls), statistics.median(c for _, c in runs)
        print(f"{name:34} {median:8.3f} {min(walls):8.3f} {max(walls):8.3f}"
              f" {median / floor:8.1f} {cpu:8.3f}")  # fmt: skip
    print()
    for command in commands(events):
        if command.startup:
            median = statistics.median(wall for wall, _ in times[command.name])
            verdict = "meets" if median <= GOAL_S else "MISSES"
            print(f"{command.name}: {verdict} the {GOAL_S} s goal (median {median:.3f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="rounds (default 21)")
    parser.add_argument("--events", type=int, default=1000, help="events piped (default 1000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="relay-cli-bench-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_"))}
        # as an installed relay runs: its modules' bytecode cached (the warm-up run
        # writes it, under the temporary directory); with PYTHONDONTWRITEBYTECODE=1
        # every run would compile Relay's sources again, a tenth of a second
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env |= {"PYTHONPYCACHEPREFIX": f"{tmp}/pycache", "RELAY_BROKER": "sqlite",
                "RELAY_BROKER_PATH": f"{tmp}/broker.db", "REDIS_STREAM": "events",
                "RELAY_STATE_DIR": f"{tmp}/state", "RELAY_RUN_DIR": f"{tmp}/run"}  # fmt: skip
        Path(tmp, "state").mkdir()
        print(f"{args.runs} rounds, interleaved; {PYTHON}")
        report(measure(args.runs, args.events, env), args.events)


if __name__ == "__main__":
    main()
