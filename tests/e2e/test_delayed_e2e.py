"""Delayed events through real ``relay start`` workers, a real Redis and real
containers (issue 33, "done when"): three workers move the due events, one of
them is killed while they wait, and each event runs once, never before its time."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import redis

from relay.domain.publication import delayed_due
from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import RelayWorker, run_relay, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.docker, pytest.mark.timeout(300)]

HANDLER = """\
import time


def handler(event):
    print("ran", event["n"], time.time_ns() // 1_000_000)
"""
TEMPLATE = """\
runtime: python3.14
concurrency: 4
events:
  - handler: jobs.later.handler
    pattern: {kind: [later]}
"""
EVENTS = 30


def _runs(workers: list[RelayWorker]) -> dict[int, list[int]]:
    """Event number -> the times (ms) it ran at, over every worker's output."""
    rx = re.compile(r'handler "jobs\.later\.handler" message "[0-9-]+": ran (\d+) (\d+)$')
    runs: dict[int, list[int]] = {}
    for worker in workers:
        for line in worker.output():
            m = rx.search(line)
            if m:
                runs.setdefault(int(m.group(1)), []).append(int(m.group(2)))
    return runs


def test_three_workers_run_each_delayed_event_once_at_its_time_though_one_is_killed(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
    unique: str,
) -> None:
    fn = functions_dir / "later"
    (fn / "jobs").mkdir(parents=True)
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "jobs" / "later.py").write_text(HANDLER)
    workers = [
        relay_worker(name=f"w{i}", env={"RELAY_HOSTNAME": f"host-{unique}-{i}"}) for i in range(3)
    ]
    lines = "".join(f'{{"kind": "later", "n": {n}}}\n' for n in range(EVENTS))
    published = run_relay(["publish", "--delay", "4s"], workers[0].admin_env, stdin=lines)
    assert published.returncode == 0, published.stderr
    dues = [delayed_due(i) for i in published.stdout.split()]
    assert len(dues) == EVENTS
    assert all(due is not None for due in dues)
    workers[2].kill()  # one worker gone while every event waits
    assert not _runs(workers)  # nothing before its time
    wait_until(lambda: len(_runs(workers)) == EVENTS, 120, "every delayed event to run")
    runs = _runs(workers)
    assert Counter(len(times) for times in runs.values()) == Counter({1: EVENTS})
    for n, due in enumerate(dues):
        assert due is not None
        assert runs[n][0] >= due, (n, runs[n][0] - due)
