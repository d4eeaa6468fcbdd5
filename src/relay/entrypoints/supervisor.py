"""``relay start --processes N``: N worker processes on one host, supervised.

Each child is an ordinary ``relay start`` (``python -m relay start``) with
``RELAY_PROCESS_INDEX=i`` and its own run directory ``<RELAY_RUN_DIR>/<i>``
(process lock, control socket, execution-container sockets; with
``RELAY_DIRECT_DIR``, ``<RELAY_DIRECT_DIR>/<i>`` for those) and consumer name:
the host's name for process 0 (so going from one process to N keeps its pending
list and its service containers) and ``<hostname>-<i>`` for the others. They
share the consumer group (Redis) or the broker file (embedded) like workers on
separate hosts would; schedules are published once per occurrence already.

Only process 0 converges the host's service containers and binds the git
webhook; process ``i`` serves metrics on ``METRICS_ADDR``'s port plus ``i``.
The parent holds ``<RELAY_RUN_DIR>/relay.lock``, so a second ``relay start`` on
the same run directory fails at once. It starts the children in their own
session (a terminal's Ctrl-C reaches the parent only) and forwards each
SIGINT/SIGTERM to all of them as SIGTERM: the first stops each gracefully within
``SHUTDOWN_GRACE``, a second ends the grace, as for one worker. A child that
exits on its own is restarted after a backoff (1 s, 2 s, 5 s, 10 s, then every
30 s; a child that ran 60 s starts again from 1 s); the parent exits once every
child has stopped after a signal. Children are sent SIGTERM by the kernel if the
parent dies (:func:`follow_supervisor`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Final

import structlog

from relay.adapters.control.lock import ProcessLock
from relay.entrypoints.config import Settings

log = structlog.get_logger("relay.supervisor")

BACKOFF_S: Final = (1.0, 2.0, 5.0, 10.0, 30.0)
STABLE_S: Final = 60.0  # a child that ran this long restarts from the first backoff
POLL_S: Final = 0.2
_PR_SET_PDEATHSIG: Final = 1
SUPERVISOR_PID: Final = "RELAY_SUPERVISOR_PID"  # set for the children only


@dataclass
class Child:
    index: int
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    restart_at: float = 0.0
    signalled: bool = field(default=False)


def child_env(env: Mapping[str, str], settings: Settings, index: int) -> dict[str, str]:
    """Process ``index``'s environment: its index, run directory and consumer name;
    only process 0 keeps the webhook; metrics and HTTP ingest on the next ports
    (every process accepts the handlers' token: it is derived alike in each)."""
    out = dict(env)
    out["RELAY_PROCESS_INDEX"] = str(index)
    out[SUPERVISOR_PID] = str(os.getpid())
    out["RELAY_RUN_DIR"] = str(settings.paths.run_dir / str(index))
    out["RELAY_HOSTNAME"] = settings.hostname if index == 0 else f"{settings.hostname}-{index}"
    shared = settings.paths.shared_direct_dir
    if shared is not None:  # each process empties its own at start: never a shared one
        out["RELAY_DIRECT_DIR"] = str(shared / str(index))
    if index > 0:
        out.pop("GIT_WEBHOOK_ADDR", None)
        out.pop("CONSOLE_ADDR", None)  # one console per host: process 0's
        metrics = settings.metrics_addr
        if metrics is not None and metrics.port != 0:
            out["METRICS_ADDR"] = f"{metrics.host}:{metrics.port + index}"
        ingest = settings.ingest.addr
        if ingest is not None:
            out["INGEST_ADDR"] = f"{ingest.host}:{ingest.port + index}"
    return out


def supervise(env: Mapping[str, str], settings: Settings, functions: Path, count: int) -> int:
    """Run ``count`` children until a signal stops them all; the exit code."""
    lock = ProcessLock(settings.paths.run_dir)  # RelayError: the caller's one line
    children = [Child(i, child_env(env, settings, i)) for i in range(count)]
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        first = not stop.is_set()
        stop.set()
        if first:
            log.info("processes_stopping", signal=signal.Signals(signum).name)
        for child in children:
            _terminate(child)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        log.info("processes_starting", processes=count, hostname=settings.hostname)
        for child in children:
            _spawn(child, functions)
        while not stop.wait(POLL_S):
            _tend(children, functions)
        for child in children:
            _terminate(child)  # one spawned just as the signal came
        for child in children:
            if child.process is not None:
                child.process.wait()
        log.info("processes_stopped", processes=count)
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        lock.close()


def _tend(children: list[Child], functions: Path) -> None:
    """Restart a child that exited on its own, after its backoff."""
    now = time.monotonic()
    for child in children:
        if child.process is not None:
            code = child.process.poll()
            if code is None:
                continue
            ran = now - child.started
            child.failures = 1 if ran >= STABLE_S else child.failures + 1
            delay = BACKOFF_S[min(child.failures, len(BACKOFF_S)) - 1]
            child.process, child.restart_at = None, now + delay
            log.warning("process_exited", index=child.index, code=code,
                        ran_s=round(ran, 1), restart_in_s=delay)
        elif now >= child.restart_at:
            _spawn(child, functions)


def _spawn(child: Child, functions: Path) -> None:
    command = [sys.executable, "-m", "relay", "start", "--functions", str(functions)]
    child.process = subprocess.Popen(command, env=child.env, start_new_session=True)
    child.started, child.signalled = time.monotonic(), False
    log.info("process_started", index=child.index, pid=child.process.pid,
             consumer=child.env["RELAY_HOSTNAME"])


def _terminate(child: Child) -> None:
    process = child.process
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGTERM)
        child.signalled = True


def follow_supervisor(env: Mapping[str, str]) -> None:
    """In a child, first thing: ask the kernel for SIGTERM when the supervisor dies
    (Linux), so a killed supervisor leaves no worker behind; a child whose
    supervisor is already gone exits at once."""
    parent = env.get(SUPERVISOR_PID, "")
    if not parent.isdigit():
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return  # not Linux: the children outlive a killed supervisor
    if os.getppid() != int(parent):
        raise SystemExit(1)
