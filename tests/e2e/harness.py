"""Run the real ``relay`` command as a user does, and watch what it prints.

``RelayWorker`` starts ``relay start`` in its own process group with every path
(state, run dir) inside a temporary directory and a unique hostname, so workers
of different tests never share a lock, a socket, a consumer name or the
containers the orphan sweep may remove.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import redis

RELAY = str(Path(sys.executable).with_name("relay"))
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "functions"
FIRST_START_TIMEOUT_S = 240.0  # the first start may build every image from scratch


def run_relay(
    args: list[str],
    env: Mapping[str, str] | None = None,
    *,
    stdin: str | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run one ``relay`` admin command to completion."""
    return subprocess.run(
        [RELAY, *args],
        env={**os.environ, **(env or {})},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_relay_in_process(
    args: list[str], env: Mapping[str, str] | None = None, *, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``run_relay`` without a process of its own: the same typer app through typer's
    runner, for assertions about what a command answers rather than about the installed
    command (an interpreter start costs a second per command, and polling loops pay it
    on every poll). ``env`` is laid over this process's environment, as ``run_relay``
    does."""
    from typer.testing import CliRunner  # noqa: PLC0415 - only the tests that use it

    from relay.entrypoints.cli import app  # noqa: PLC0415

    result = CliRunner().invoke(app, args, env=dict(env or {}), input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        [RELAY, *args], result.exit_code, result.stdout, result.stderr
    )


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> object:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


class RelayWorker:
    """One ``relay start`` process with its own state and run directories."""

    def __init__(self, root: Path, functions: Path, env: Mapping[str, str]) -> None:
        self.root = root
        self.functions = functions
        self.state_dir = root / "state"
        self.run_dir = root / "run"
        self.env = {
            **os.environ,
            "RELAY_STATE_DIR": str(self.state_dir),
            "RELAY_RUN_DIR": str(self.run_dir),
            **env,
        }
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.process: subprocess.Popen[str] | None = None

    @property
    def admin_env(self) -> dict[str, str]:
        """What an operator's shell needs for admin commands against this worker."""
        keep = ("REDIS_URI", "REDIS_STREAM", "REDIS_GROUP", "RELAY_STATE_DIR", "RELAY_RUN_DIR")
        return {k: self.env[k] for k in keep if k in self.env}

    def start(self, *, wait: bool = True, args: Sequence[str] = ()) -> RelayWorker:
        self.process = subprocess.Popen(
            [RELAY, "start", "--functions", str(self.functions), *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()
        if wait:
            self.wait_for(r"msg=relay_started", timeout=FIRST_START_TIMEOUT_S)
        return self

    def _pump(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def output(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def find(self, pattern: str) -> list[str]:
        rx = re.compile(pattern)
        return [line for line in self.output() if rx.search(line)]

    def wait_for(self, pattern: str, timeout: float = 60.0, count: int = 1) -> list[str]:
        def seen() -> list[str] | None:
            found = self.find(pattern)
            if len(found) >= count:
                return found
            if self.process is not None and self.process.poll() is not None:
                tail = "\n".join(self.output()[-20:])
                raise AssertionError(
                    f"relay exited ({self.process.returncode}) before {pattern!r}:\n{tail}"
                )
            return None

        try:
            return wait_until(seen, timeout, repr(pattern))  # type: ignore[return-value]
        except AssertionError as exc:
            tail = "\n".join(self.output()[-30:])
            raise AssertionError(f"{exc}\n--- last output ---\n{tail}") from None

    def signal(self, signum: int) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signum)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.process is None:
            return 0
        if self.process.poll() is not None:
            self._close()
            return self.process.returncode
        self.signal(signal.SIGTERM)
        code = self.process.wait(timeout=timeout)
        self._close()
        return code

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self._close()

    def _close(self) -> None:
        """Drain the output reader and close the pipe (no unclosed-file warnings)."""
        self._pump_thread.join(timeout=10)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()


def text(value: object) -> str:
    """A Redis reply value as text (the clients here do not decode replies)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def send_event(client: redis.Redis, stream: str, event: object) -> str:
    """XADD ``event`` as JSON in the ``event`` field, as producers do; the entry id."""
    return text(client.xadd(stream, {"event": json.dumps(event)}))


def copy_function(source: Path, functions: Path, name: str | None = None) -> Path:
    """Copy a function directory into a test's functions directory."""
    target = functions / (name or source.name)
    shutil.copytree(source, target)
    return target
