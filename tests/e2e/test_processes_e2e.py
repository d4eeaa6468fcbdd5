"""``relay start --processes 2`` on the embedded broker (issue 29.5): two worker
processes share the broker file, both lease and run events, ``relay health`` and
``relay stats`` answer for the host, and one SIGTERM to the parent stops both."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from tests.e2e.embedded_support import admin_env, broker_rows, no_redis_env
from tests.e2e.harness import FIRST_START_TIMEOUT_S, RelayWorker, run_relay, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

EVENTS = 20
TEMPLATE = """\
runtime: python3.14
events:
  - handler: jobs.work.handler
    pattern:
      kind: [work]
    retries: 0
"""
WORK = """\
import time


def handler(event):
    time.sleep(0.3)
    print("worked", event["n"], flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_processes_share_the_broker_file_and_stop_together(
    tmp_path: Path, functions_dir: Path, broker_file: Path, unique: str
) -> None:
    fn = functions_dir / "work"
    (fn / "jobs").mkdir(parents=True)
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "jobs" / "work.py").write_text(WORK)
    host = f"procs-{unique}"
    worker = RelayWorker(tmp_path / "root", functions_dir, {})
    worker.env = {
        **no_redis_env(),
        **{k: v for k, v in worker.env.items() if not k.startswith("REDIS_")},
        "RELAY_BROKER": "sqlite",
        "RELAY_BROKER_PATH": str(broker_file),
        "RELAY_HOSTNAME": host,
        "LOG_LEVEL": "DEBUG",
        "SHUTDOWN_GRACE": "10s",
        # small batches, so one process cannot lease every event before the other reads
        "MAX_BUFFERED_EVENTS": "2",
        "MAX_CONCURRENCY": "2",
    }
    worker.start(wait=False, args=["--processes", "2"])
    try:
        worker.wait_for(r"msg=relay_started", timeout=FIRST_START_TIMEOUT_S, count=2)
        worker.wait_for(r"msg=function_prepared function=work ", timeout=240, count=2)
        pids = [int(p) for p in re.findall(r"msg=process_started .*?pid=(\d+)",
                                           "\n".join(worker.output()))]
        assert len(pids) == 2
        env = admin_env(worker)
        events = "\n".join(json.dumps({"kind": "work", "n": n}) for n in range(EVENTS))
        published = run_relay(["publish"], env, stdin=events + "\n")
        assert published.returncode == 0, published.stderr
        worker.wait_for(r"worked \d+$", timeout=120, count=EVENTS)
        consumers = {c for (c,) in broker_rows(
            broker_file, "SELECT DISTINCT consumer FROM jobs WHERE state = 'acked'")}
        assert consumers == {host, f"{host}-1"}, "both processes leased and ran events"

        health = run_relay(["health"], env)
        assert health.returncode == 0, health.stderr

        def counted() -> bool:  # each process flushes its own stats every 5 s
            shown = run_relay(["stats", "--json"], env)
            return shown.returncode == 0 and json.loads(shown.stdout)["events_received"] == EVENTS

        wait_until(counted, 30, f"relay stats to add up {EVENTS} events of both processes")

        # a child that dies is started again (after a 1 s backoff) under its name
        os.kill(pids[1], signal.SIGKILL)
        worker.wait_for(r"msg=process_exited .*index=1", timeout=30)
        worker.wait_for(r"msg=process_started .*index=1", timeout=30, count=2)
        worker.wait_for(r"msg=relay_started", timeout=120, count=3)
        pids += [int(p) for p in re.findall(r"msg=process_started .*?pid=(\d+)",
                                            "\n".join(worker.output()))[2:]]
        again = run_relay(["publish", "--event", json.dumps({"kind": "work", "n": EVENTS})], env)
        assert again.returncode == 0, again.stderr
        worker.wait_for(rf"worked {EVENTS}$", timeout=60)
    finally:
        code = worker.stop(timeout=60)
    assert code == 0
    assert len(worker.find(r"msg=relay_stopped")) == 2  # the killed one never said it
    assert worker.find(r"msg=processes_stopped")
    assert not [pid for pid in pids if _alive(pid)]
