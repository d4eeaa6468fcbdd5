"""compose.dev.yaml as a benchmark subject: Relay in its container, behind the proxy.

The stack runs under a project of its own with the benchmark's no-op function mounted
at /functions (compose.bench.yaml on top); the host reaches the stack's Redis on its
bridge address (no published port, no docker-proxy hop), and every other phase of
bench/throughput.py uses that same Redis, so the figures sit side by side."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("-f", str(ROOT / "compose.dev.yaml"), "-f", str(ROOT / "bench" / "compose.bench.yaml"))
ATTACH = ("-f", str(ROOT / "bench" / "compose.attach.yaml"))  # RELAY_DIRECT_DIR= : fast path off


def _compose() -> list[str]:
    return ["docker-compose"] if shutil.which("docker-compose") else ["docker", "compose"]


def _inspect(name: str, template: str) -> str:
    done = subprocess.run(
        ["docker", "inspect", "-f", template, name], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


@dataclass
class ComposeWorker:
    project: str
    env: dict[str, str]
    direct: bool = True

    def _run(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            [*_compose(), "-p", self.project, *FILES, *(() if self.direct else ATTACH), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and done.returncode != 0:
            raise SystemExit(f"bench: compose {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout + done.stderr

    def container(self, service: str) -> str:
        return self._run("ps", "-q", service).strip()

    def alive(self) -> bool:
        return _inspect(self.container("relay"), "{{.State.Running}}") == "true"

    def health(self) -> str:
        return _inspect(self.container("relay"), "{{.State.Health.Status}}")

    @property
    def pid(self) -> int:
        """The host pid of ``relay start`` (the child of the container's tini)."""
        init = _inspect(self.container("relay"), "{{.State.Pid}}")
        children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
        return int(children[0]) if children else int(init)

    def redis_url(self) -> str:
        address = _inspect(
            self.container("redis"),
            "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
        ).split()[0]
        return f"redis://{address}:6379"

    def log_tail(self, lines: int = 30) -> str:
        return self._run("logs", "--no-color", "--tail", str(lines), "relay", check=False)

    def stop(self) -> None:
        self._run("down", "-v", "--remove-orphans", "--timeout", "40", check=False)
        # the host directory shared with the engine for the fast path (a bind mount)
        shutil.rmtree(Path("/run/relay-sockets") / self.env["RELAY_HOSTNAME"], ignore_errors=True)


@contextlib.contextmanager
def compose_stack(
    functions: Path, stream: str, *, direct: bool = True, timeout_s: float = 600.0
) -> Iterator[ComposeWorker]:
    """Bring the stack up (``--build``) with ``functions`` at /functions, consuming
    ``stream``; wait until relay is healthy; tear everything down afterwards."""
    # the relay user (uid 10000) must read the mounted function directory
    for path in (functions, *functions.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    for parent in functions.parents:
        if parent == Path(parent.anchor):
            break
        parent.chmod(parent.stat().st_mode | 0o005)
    suffix = secrets.token_hex(3)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_"))},
        "RELAY_FUNCTIONS": str(functions),
        "RELAY_HOSTNAME": f"relay-bench-{suffix}",
        "BENCH_STREAM": stream,
    }
    worker = ComposeWorker(f"relay-bench-{suffix}", env, direct)
    try:
        print("compose: docker-compose up --build -d (compose.dev.yaml + bench/compose.bench.yaml)")
        worker._run("up", "--build", "-d")
        deadline = time.monotonic() + timeout_s
        while worker.health() != "healthy":
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: relay not healthy:\n{worker.log_tail()}")
            time.sleep(0.5)
        yield worker
    finally:
        worker.stop()
