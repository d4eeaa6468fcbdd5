"""How often this machine pauses a running thread, and for how long.

    .venv/bin/python bench/jitter.py [--seconds 10] [--period-us 200] [--gap-ms 1.5]

One thread sleeps ``--period-us`` at a time for ``--seconds`` and reports every
wake-up that came more than ``--gap-ms`` after the previous one: time the
thread was ready but not running (the hypervisor, the kernel, other
processes). Run it on an otherwise idle machine to see what the machine
itself adds to a latency tail, before blaming the code under test; next to a
benchmark it shows how busy the cores are.

Prints each gap with when it happened, then the count, the longest gap and the
median spacing between gaps. Not a test: no assertions on the figures.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time


def gaps(seconds: float, period_s: float, gap_s: float) -> list[tuple[float, float]]:
    """(when, how long) of every wake-up later than ``gap_s`` after the last."""
    start = last = time.monotonic()
    found: list[tuple[float, float]] = []
    while last - start < seconds:
        time.sleep(period_s)
        now = time.monotonic()
        if now - last > gap_s:
            found.append((last - start, now - last))
        last = now
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--period-us", type=float, default=200.0)
    parser.add_argument("--gap-ms", type=float, default=1.5)
    args = parser.parse_args()
    if args.seconds <= 0 or args.period_us <= 0 or args.gap_ms <= 0:
        parser.error("--seconds, --period-us and --gap-ms must be positive")
    found = gaps(args.seconds, args.period_us / 1e6, args.gap_ms / 1e3)
    for when, took in found:
        print(f"t={when:8.3f}s  gap {took * 1e3:6.2f} ms")
    if not found:
        print(f"no gap over {args.gap_ms:g} ms in {args.seconds:g} s")
        return
    spacing = [b[0] - a[0] for a, b in itertools.pairwise(found)]
    longest = max(took for _, took in found)
    line = f"{len(found)} gaps over {args.gap_ms:g} ms in {args.seconds:g} s"
    line += f", longest {longest * 1e3:.2f} ms"
    if spacing:
        line += f", median spacing {statistics.median(spacing):.3f} s"
    print(line)


if __name__ == "__main__":
    main()
