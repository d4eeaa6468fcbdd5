"""Edit-to-serving time of live reload, with a cached dependency layer.

A Python function with a ``requirements.txt`` is prepared once (building its
``relay-dep-*`` image), then its handler is edited N times. Each run measures:

- ``edit->serving``: from writing the file to the first invocation through the
  warm runtime that prints the new output, going through the real watcher (so
  the 750 ms debounce is included), the real image builder and the runtime;
- ``reconcile``: the same edit reconciled directly (no watcher, no debounce);
- baseline ``no-change``: a reconcile of the unchanged function (fingerprint,
  image lookup, no build), measured in the same run.

Usage: ``.venv/bin/python bench/reload.py [--runs N]`` (needs the Docker engine
and the stand-in images; creates only images labelled ``relay.test.id=bench-*``
and removes them at the end).
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import aiodocker
import anyio

from relay.adapters.docker.images import DockerImageBuilder
from relay.adapters.docker.runtime import DockerContainerRuntime
from relay.adapters.fs.discovery import FsFunctionSource
from relay.adapters.fs.watcher import FunctionsWatcher
from relay.adapters.system import SystemClock
from relay.application.concurrency import Slots
from relay.application.reconcile import PREPARED, UNCHANGED, Reconciler
from relay.application.registry import FunctionRegistry
from relay.domain.execution import InvocationRequest

TEMPLATE = """\
runtime: python3.14
events:
  - handler: main.handler
    pattern:
      event_name: [INSERT]
"""
HANDLER = 'def handler(event):\n    print("VERSION {version}")\n'


class Bench:
    def __init__(
        self,
        root: Path,
        docker: aiodocker.Docker,
        runtime: DockerContainerRuntime,
        lines: list[str],
        labels: dict[str, str],
    ) -> None:
        self.name = f"bench-{secrets.token_hex(3)}"
        self.docker = docker
        self.directory = root / self.name
        self.lines = lines
        self.runtime = runtime
        self.builder = DockerImageBuilder(docker, labels=labels)

        async def publish(_events: object) -> None:
            return None

        self.reconciler = Reconciler(
            registry=FunctionRegistry(),
            source=FsFunctionSource(root),
            builder=self.builder,
            runtime=runtime,
            slots=Slots(max_concurrency=8),
            clock=SystemClock(),
            publish=publish,
        )

    def write(self, version: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "template.yaml").write_text(TEMPLATE)
        (self.directory / "requirements.txt").write_text("six==1.16.0\n")
        (self.directory / "main.py").write_text(HANDLER.format(version=version))

    async def serves(self, version: str) -> bool:
        result = await self.runtime.invoke(
            InvocationRequest(function=self.name, handler="main.handler", event=b"{}")
        )
        return result.ok and any(line.endswith(f"VERSION {version}") for line in self.lines[-3:])

    async def until_serving(self, version: str, previous: str | None) -> None:
        with anyio.fail_after(120):
            while True:
                current = self.reconciler.registry.get(self.name)
                if current is not None and current.image != previous and await self.serves(version):
                    return
                await anyio.sleep(0.02)

    def image(self) -> str | None:
        current = self.reconciler.registry.get(self.name)
        return current.image if current else None

    async def cleanup(self) -> None:
        self.runtime.remove(self.name)
        with anyio.move_on_after(30):
            while self.runtime.snapshot(self.name) is not None:  # noqa: ASYNC110 - a poll
                await anyio.sleep(0.1)
        # AutoRemove deletes the last containers asynchronously; retry until the
        # images are no longer referenced.
        with anyio.move_on_after(30):
            while await self.builder.retire(self.name, ()) or await self._left():  # noqa: ASYNC110
                await anyio.sleep(0.5)
        await self.builder.collect_dependency_images()

    async def _left(self) -> bool:
        images = await self.docker.images.list(filters={"label": [f"relay.function={self.name}"]})
        return bool(images)


async def main(runs: int) -> None:
    labels = {"relay.test": "true", "relay.test.id": f"bench-{secrets.token_hex(4)}"}
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        async with (
            aiodocker.Docker() as docker,
            DockerContainerRuntime(
                docker, hostname=labels["relay.test.id"], output=lines.append
            ) as runtime,
        ):
            bench = Bench(root, docker, runtime, lines, labels)
            try:
                await measure(bench, runs)
            finally:
                await bench.cleanup()


async def measure(bench: Bench, runs: int) -> None:
    bench.write("0")
    started = time.perf_counter()
    assert await bench.reconciler.reconcile_function(bench.name) == PREPARED
    await bench.until_serving("0", None)
    print(f"first prepare (dependency image built): {time.perf_counter() - started:.2f}s")

    baseline: list[float] = []
    direct: list[float] = []
    for i in range(runs):
        started = time.perf_counter()
        assert await bench.reconciler.reconcile_function(bench.name) == UNCHANGED
        baseline.append(time.perf_counter() - started)
        previous = bench.image()
        bench.write(f"d{i}")
        started = time.perf_counter()
        assert await bench.reconciler.reconcile_function(bench.name) == PREPARED
        await bench.until_serving(f"d{i}", previous)
        direct.append(time.perf_counter() - started)

    watched: list[float] = []
    watcher = FunctionsWatcher(
        bench.directory.parent, bench.reconciler.reconcile_function, bench.reconciler.reconcile_all
    )
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run)
        for i in range(runs):
            previous = bench.image()
            started = time.perf_counter()
            bench.write(f"w{i}")
            await bench.until_serving(f"w{i}", previous)
            watched.append(time.perf_counter() - started)
        tg.cancel_scope.cancel()

    base = statistics.median(baseline)
    for label, values in (
        ("no-change reconcile (baseline)", baseline),
        ("edit -> serving, reconcile only", direct),
        ("edit -> serving, via watcher (750 ms debounce)", watched),
    ):
        median = statistics.median(values)
        print(
            f"{label:<48} median {median * 1000:8.1f} ms  "
            f"({median / base:6.1f}x baseline)  n={len(values)}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    anyio.run(main, parser.parse_args().runs)
