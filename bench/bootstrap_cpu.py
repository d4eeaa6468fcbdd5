"""CPU per request of the Python bootstrap: the working tree's against an older one.

    .venv/bin/python bench/bootstrap_cpu.py [--requests 20000] [--rounds 5] [--old-rev REV]

Runs the bootstrap as a plain host subprocess (no Docker) serving a no-op
handler, sends ``--requests`` requests one at a time (each with the environment
Relay sends: one template variable and the handler context of
``relay.domain.handler_context``, whose message id and deadline change every
time), and
reads the process's user + system CPU from ``/proc`` before and after: the
bootstrap's own cost per request, which a warm container pays on every event.
The old side is ``python_bootstrap.py`` at ``--old-rev``; the two alternate
within each round and the figures are medians. Prints figures only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _redisbench import process_cpu_s  # noqa: E402

from relay.adapters.docker.bootstraps import END_MARKER_PREFIX as MARKER  # noqa: E402
from relay.domain.handler_context import HandlerContext, invocation_env  # noqa: E402

SOURCE = "src/relay/adapters/docker/bootstraps/python_bootstrap.py"


def measure(source: bytes, app: Path, requests: int) -> float:
    script = app.parent / "bootstrap.py"
    script.write_bytes(source)
    process = subprocess.Popen(
        [sys.executable, "-u", str(script)],
        cwd=app,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    assert process.stdin is not None
    assert process.stderr is not None
    stdin, stderr = process.stdin, process.stderr

    def call(n: int) -> None:
        request = {
            "id": f"n{n}",
            "handler": "bench.noop",
            "env": {
                "BENCH_SETTING": "1",
                **invocation_env(
                    "bench.noop", HandlerContext(message_id=f"1700000000000-{n}"), time.time() + 5
                ),
            },
            "event": '{"n": 1}',
            "timeout_s": 5,
        }
        stdin.write(json.dumps(request).encode() + b"\n")
        stdin.flush()
        data = b""
        while MARKER not in data or not data.endswith(b"\n"):
            data += stderr.read1(65536)

    try:
        for n in range(200):  # imports, first allocations
            call(n)
        before = process_cpu_s(process.pid)
        for n in range(requests):
            call(n)
        return (process_cpu_s(process.pid) - before) / requests * 1e6
    finally:
        stdin.close()
        process.wait(timeout=10)
        stderr.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--old-rev", default="ebd7f71", help="the bootstrap before the change")
    args = parser.parse_args()
    old = subprocess.run(
        ["git", "show", f"{args.old_rev}:{SOURCE}"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    new = (ROOT / SOURCE).read_bytes()
    figures: dict[str, list[float]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="relay-bootstrap-bench-") as tmp:
        app = Path(tmp) / "app"
        app.mkdir()
        (app / "bench.py").write_text("def noop(event):\n    return None\n")
        for n in range(args.rounds):
            sides = [("old", old), ("new", new)]
            for name, source in sides if n % 2 == 0 else reversed(sides):
                figures[name].append(measure(source, app, args.requests))
            print(
                f"round {n + 1}: old {figures['old'][-1]:5.1f} us/request   "
                f"new {figures['new'][-1]:5.1f} us/request",
                flush=True,
            )
    old_median, new_median = statistics.median(figures["old"]), statistics.median(figures["new"])
    print(
        f"median : old {old_median:5.1f}   new {new_median:5.1f}   "
        f"new/old {new_median / old_median:.2f}"
    )


if __name__ == "__main__":
    main()
