"""``docs/tutorial.md`` runs as written: every ``sh`` block, in order, on a real Docker
engine and the embedded broker, as a user would type it in an empty directory.

The commands are parsed out of the page, so the page and this test cannot drift. Each
``sh`` block is preceded by an HTML comment (invisible once rendered) saying how to run
it: ``env`` (exports every later block starts with), ``run`` (must exit 0),
``expect="TEXT"`` (exit 0 with TEXT in its output), ``until="TEXT"`` (run again until
it exits 0 with TEXT, within a deadline), ``background ready="TEXT"`` (the worker's
terminal: started and left running until TEXT appears in its output), and
``worker="TEXT"`` (after the block, TEXT must appear in the worker's output).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
import pytest

from tests.e2e.harness import FIRST_START_TIMEOUT_S, REPO, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

TUTORIAL = REPO / "docs" / "tutorial.md"
_MARKER = re.compile(r"<!-- test: (?P<spec>.*) -->")
BLOCK_TIMEOUT_S = 120.0
UNTIL_TIMEOUT_S = 300.0  # the fix is seen only after a rebuild of the function's image


@dataclass(frozen=True)
class Block:
    line: int
    script: str
    options: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"tutorial.md:{self.line}: {self.script.splitlines()[0]}"


def parse(text: str) -> list[Block]:
    """Every ``sh`` block with the options of the marker right above it."""
    lines = text.splitlines()
    blocks: list[Block] = []
    for i, line in enumerate(lines):
        if not line.startswith("```sh"):
            continue
        marker = _MARKER.fullmatch(lines[i - 1].strip()) if i else None
        assert marker, f"tutorial.md:{i + 1}: an sh block without a <!-- test: ... --> line"
        end = lines.index("```", i + 1)
        options = dict(word.partition("=")[::2] for word in shlex.split(marker["spec"]))
        blocks.append(Block(i + 2, "\n".join(lines[i + 1 : end]) + "\n", options))
    return blocks


class Terminal:
    """The reader's shell: the tutorial's directory and environment."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.prelude = ""
        self.worker: subprocess.Popen[str] | None = None
        self.worker_lines: list[str] = []
        self._pump_thread: threading.Thread | None = None

    def run(self, block: Block) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", self.prelude + block.script],
            cwd=self.root, env=self.env, capture_output=True, text=True,
            timeout=BLOCK_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL,
        )

    def start(self, block: Block) -> None:
        self.worker = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", self.prelude + "exec " + block.script],
            cwd=self.root, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, start_new_session=True,
        )
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.worker is not None
        assert self.worker.stdout is not None
        for line in self.worker.stdout:
            self.worker_lines.append(line.rstrip("\n"))

    def worker_says(self, text: str, timeout: float) -> None:
        def seen() -> bool:
            if any(text in line for line in list(self.worker_lines)):
                return True
            assert self.worker is not None
            assert self.worker.poll() is None, self.tail(f"the worker exited before {text!r}")
            return False

        try:
            wait_until(seen, timeout, f"the worker to print {text!r}")
        except AssertionError as exc:
            raise AssertionError(self.tail(str(exc))) from None

    def tail(self, what: str) -> str:
        return what + "\n--- the worker's last lines ---\n" + "\n".join(self.worker_lines[-30:])

    def stop(self) -> None:
        if self.worker is None:
            return
        if self.worker.poll() is None:
            os.killpg(self.worker.pid, signal.SIGINT)  # Ctrl-C, as the tutorial says
            try:
                self.worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.worker.pid, signal.SIGKILL)
                self.worker.wait()
        if self._pump_thread is not None:
            self._pump_thread.join(timeout=10)  # it ends at the pipe's end of file
        if self.worker.stdout is not None:
            self.worker.stdout.close()


@pytest.fixture
def terminal(tmp_path: Path, unique: str) -> Iterator[Terminal]:
    root = tmp_path / "tutorial"
    root.mkdir()
    hostname = f"tutorial-{unique}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["RELAY_HOSTNAME"] = hostname  # the owner label of this test's containers
    env["SHUTDOWN_GRACE"] = "10s"
    shell = Terminal(root, env)
    yield shell
    shell.stop()
    client = docker.from_env()
    try:
        label = f"relay.hostname={hostname}"
        for c in client.containers.list(all=True, sparse=True, filters={"label": label}):
            with contextlib.suppress(docker.errors.APIError):  # already going away
                c.remove(force=True)
    finally:
        client.close()


def test_the_tutorial_parses_into_marked_blocks() -> None:
    blocks = parse(TUTORIAL.read_text())
    kinds = [next(iter(b.options)) for b in blocks]
    assert kinds[0] == "env"
    assert kinds.count("background") == 1
    assert sum("until" in b.options for b in blocks) >= 2


def run_block(shell: Terminal, block: Block) -> None:
    if "background" in block.options:
        shell.start(block)
        shell.worker_says(block.options["ready"], FIRST_START_TIMEOUT_S)
        return
    if "until" in block.options:
        want = block.options["until"]

        def done() -> bool:
            result = shell.run(block)
            return result.returncode == 0 and want in result.stdout

        try:
            wait_until(done, UNTIL_TIMEOUT_S, f"{block} to print {want!r}")
        except AssertionError as exc:
            raise AssertionError(shell.tail(str(exc))) from None
    else:
        result = shell.run(block)
        assert result.returncode == 0, f"{block}\n{result.stdout}{result.stderr}"
        assert block.options.get("expect", "") in result.stdout, f"{block}\n{result.stdout}"
    if "worker" in block.options:
        shell.worker_says(block.options["worker"], BLOCK_TIMEOUT_S)


def test_every_command_of_the_tutorial_runs_as_written(terminal: Terminal) -> None:
    """Write, validate, match, start, publish, fail, the DLQ, fix, replay: each step
    is the page's own commands, and each says what the page says it does."""
    for block in parse(TUTORIAL.read_text()):
        if "env" in block.options:
            terminal.prelude += block.script
            continue
        run_block(terminal, block)
    terminal.stop()
    assert terminal.worker is not None
    assert terminal.worker.returncode == 0, terminal.tail("relay start did not exit cleanly")
