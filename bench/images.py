"""Image preparation times: cold dependency images, warm rebuilds, reuse.

For each case a fresh label scope (``relay.test.id=bench-images-*``) makes every
dependency image cold on the first prepare; then the handler is edited N times
(a warm rebuild on the cached dependency image) and prepared once more unchanged
(the reuse path: fingerprint and one image lookup). Ratios are printed against
the reuse baseline measured in the same run.

Usage: ``.venv/bin/python bench/images.py [--runs N]`` (needs the Docker engine and
the stand-in images; removes every image it created at the end).
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import aiodocker
import anyio

from relay.adapters.docker.images import DockerImageBuilder
from relay.adapters.fs.templates import load_template

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "python, no deps": (ROOT / "examples/functions/user-events-python", "events/created.py"),
    "python, requirements.txt (six)": (
        ROOT / "tests/integration/image_fixtures/python-requirements",
        "handler.py",
    ),
    "python, uv.lock (six)": (
        ROOT / "tests/integration/image_fixtures/python-uv-lock",
        "handler.py",
    ),
    "node, package-lock (is-number)": (
        ROOT / "tests/integration/image_fixtures/node-package-lock",
        "handler.js",
    ),
    "typescript example": (
        ROOT / "examples/functions/order-confirmation-typescript",
        "src/message.ts",
    ),
}


async def timed(builder: DockerImageBuilder, name: str, directory: Path) -> tuple[float, bool]:
    template = load_template(directory / "template.yaml")
    start = time.perf_counter()
    image = await builder.prepare(name, directory, template)
    return time.perf_counter() - start, image.built


async def cleanup(docker: aiodocker.Docker, scope: str) -> None:
    for kind in ("function", "dependency"):
        images = await docker.images.list(
            filters={"label": [f"relay.test.id={scope}", f"relay.type={kind}"]}
        )
        for image in images:
            tags = [t for t in image.get("RepoTags") or [] if t != "<none>:<none>"]
            for ref in tags or [image["Id"]]:
                await docker.images.delete(ref)


async def main(runs: int) -> None:
    scope = f"bench-images-{secrets.token_hex(4)}"
    async with aiodocker.Docker() as docker:
        builder = DockerImageBuilder(docker, labels={"relay.test": "true", "relay.test.id": scope})
        try:
            with tempfile.TemporaryDirectory() as tmp:
                for index, (label, (source, edited)) in enumerate(CASES.items()):
                    directory = Path(tmp) / f"fn{index}"
                    shutil.copytree(source, directory)
                    name = f"{scope}-{index}"
                    cold, _ = await timed(builder, name, directory)
                    warm = []
                    for run in range(runs):
                        with (directory / edited).open("a") as handle:
                            handle.write(
                                f"\n// edit {run}\n"
                                if edited.endswith("s")
                                else f"\n# edit {run}\n"
                            )
                        seconds, built = await timed(builder, name, directory)
                        assert built
                        warm.append(seconds)
                    reuse, built = await timed(builder, name, directory)
                    assert not built, f"{label}: an unchanged function was rebuilt"
                    median = statistics.median(warm)
                    print(
                        f"{label:34} cold {cold:6.2f}s  warm rebuild median {median:5.2f}s"
                        f" (x{median / reuse:,.0f} of reuse)  reuse {reuse * 1000:6.1f}ms"
                    )
        finally:
            await cleanup(docker, scope)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    anyio.run(main, parser.parse_args().runs)
