"""Warm container pool against cold ``docker run``, measured side by side.

    .venv/bin/python bench/warm.py [--invocations 2000] [--cold-runs 10]

Builds a throwaway image FROM python:3.14-slim with Relay's bootstrap and a
no-op handler (label relay.test=true, removed afterwards), then reports:

* cold ``docker run --rm <image> python -c pass`` wall time (the baseline);
* Relay's own cold start (first invocation: create + attach + start + run);
* the floor: a line echoed through a bare attached container (no Relay);
* warm invocations through DockerContainerRuntime with 1 and with 4 warm
  containers: invocations per second and p50/p99 round trip (and Node with 1,
  from an image FROM node:24-alpine).

Figures are machine-dependent; compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiodocker
import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from relay.adapters.docker.bootstraps import bootstrap_source
from relay.adapters.docker.runtime import DockerContainerRuntime
from relay.domain.execution import InvocationRequest

HANDLERS = {
    "python3.14": ("python:3.14-slim", "bench.py", "def noop(event):\n    return None\n"),
    "node24": ("node:24-alpine", "bench.mjs", "export function noop(event) {}\n"),
}


def build_image(runtime: str = "python3.14") -> str:
    base, filename, handler = HANDLERS[runtime]
    tag = f"relay-bench-warm-{runtime.replace('.', '')}:{secrets.token_hex(4)}"
    path, source = bootstrap_source(runtime)
    with tempfile.TemporaryDirectory() as context:
        root = Path(context)
        (root / "bootstrap").write_bytes(source)
        (root / filename).write_text(handler)
        (root / "Dockerfile").write_text(
            f"FROM {base}\nCOPY bootstrap {path}\nCOPY {filename} /app/{filename}\n"
            "WORKDIR /app\nLABEL relay.test=true\n"
        )
        subprocess.run(
            ["docker", "build", "-q", "-t", tag, context], check=True, capture_output=True
        )
    return tag


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cold_docker_run(image: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        begun = time.perf_counter()
        subprocess.run(
            ["docker", "run", "--rm", image, "python", "-c", "pass"],
            check=True,
            capture_output=True,
        )
        times.append(time.perf_counter() - begun)
    return times


async def warm(
    image: str, containers: int, invocations: int, runtime_name: str = "python3.14"
) -> tuple[float, list[float], float]:
    request = InvocationRequest(function="bench", handler="bench.noop", event=b"{}")
    latencies: list[float] = []
    async with (
        aiodocker.Docker() as docker,
        DockerContainerRuntime(
            docker, hostname=f"bench-{secrets.token_hex(4)}", output=lambda _: None
        ) as runtime,
    ):
        runtime.activate("bench", image, runtime_name, containers)
        begun = time.perf_counter()
        async with anyio.create_task_group() as tg:  # warm every container first
            for _ in range(containers):
                tg.start_soon(runtime.invoke, request)
        first_cold = time.perf_counter() - begun
        snapshot = runtime.snapshot("bench")
        assert snapshot is not None
        assert snapshot.containers == containers, snapshot

        async def worker(count: int) -> None:
            for _ in range(count):
                started = time.perf_counter()
                result = await runtime.invoke(request)
                latencies.append(time.perf_counter() - started)
                assert result.ok, result.error

        begun = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(containers):
                tg.start_soon(worker, invocations // containers)
        elapsed = time.perf_counter() - begun
    return len(latencies) / elapsed, latencies, first_cold


ECHO = "import sys\nfor line in sys.stdin:\n    sys.stdout.write(line)\n    sys.stdout.flush()\n"


async def raw_attach(image: str, invocations: int) -> list[float]:
    """The floor: one line echoed through a bare attached container, no Relay."""
    latencies: list[float] = []
    async with aiodocker.Docker() as docker:
        container = await docker.containers.create(
            config={
                "Image": image,
                "Cmd": ["python", "-u", "-c", ECHO],
                "OpenStdin": True,
                "StdinOnce": True,
                "AttachStdin": True,
                "AttachStdout": True,
                "Labels": {"relay.test": "true"},
                "HostConfig": {"AutoRemove": True},
            }
        )
        try:
            stream = container.attach(stdin=True, stdout=True, stderr=True)
            async with stream:
                await container.start()
                for _ in range(invocations):
                    started = time.perf_counter()
                    await stream.write_in(b"ping\n")
                    message = await stream.read_out()
                    assert message is not None
                    latencies.append(time.perf_counter() - started)
        finally:
            await container.delete(force=True)
    return latencies


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--invocations", type=int, default=2000)
    parser.add_argument("--cold-runs", type=int, default=10)
    args = parser.parse_args()
    image = build_image()
    try:
        cold = await anyio.to_thread.run_sync(cold_docker_run, image, args.cold_runs)
        floor = await raw_attach(image, args.invocations)
        rows = []
        for containers in (1, 4):
            rate, latencies, first_cold = await warm(image, containers, args.invocations)
            rows.append(("python", containers, rate, latencies, first_cold))
        node = await anyio.to_thread.run_sync(build_image, "node24")
        try:
            rate, latencies, first_cold = await warm(node, 1, args.invocations, "node24")
            rows.append(("node", 1, rate, latencies, first_cold))
        finally:
            await anyio.run_process(["docker", "rmi", "-f", node], check=False)
    finally:
        await anyio.run_process(["docker", "rmi", "-f", image], check=False)
    cold_p50 = statistics.median(cold)
    print(
        f"cold docker run --rm (n={len(cold)}): p50 {ms(cold_p50)}"
        f"  p99 {ms(percentile(cold, 0.99))}"
        f"  => {1 / cold_p50:7.1f} runs/s"
    )
    print(
        f"raw attach echo, no Relay (n={len(floor)}): p50 {ms(statistics.median(floor))}"
        f"  p99 {ms(percentile(floor, 0.99))}"
    )
    for lang, containers, rate, latencies, first_cold in rows:
        p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
        print(
            f"warm {lang}, {containers} container(s) (n={len(latencies)}):"
            f" {rate:8.0f} invocations/s"
            f"  p50 {ms(p50)}  p99 {ms(p99)}  first (cold) {ms(first_cold)}"
            f"  | cold p50 / warm p50 = {cold_p50 / p50:6.0f}x"
        )


if __name__ == "__main__":
    anyio.run(main)
