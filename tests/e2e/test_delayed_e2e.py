"""Delayed events through real ``relay start`` workers and real containers (issue
33, "done when"), on Redis and on the embedded broker: three workers, one killed
while the events wait; each event runs once, never before its time."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import redis

from relay.domain.publication import delayed_due
from tests.e2e.conftest import WorkerFactory
from tests.e2e.embedded_support import EmbeddedWorkers, admin_env, broker_rows
from tests.e2e.harness import RelayWorker, run_relay, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.timeout(300)]

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


def _function(functions_dir: Path) -> None:
    fn = functions_dir / "later"
    (fn / "jobs").mkdir(parents=True)
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "jobs" / "later.py").write_text(HANDLER)


def _publish_delayed(env: dict[str, str]) -> list[str]:
    lines = "".join(f'{{"kind": "later", "n": {n}}}\n' for n in range(EVENTS))
    published = run_relay(["publish", "--delay", "4s"], env, stdin=lines)
    assert published.returncode == 0, published.stderr
    ids = published.stdout.split()
    assert len(ids) == EVENTS
    return ids


def _each_ran_once_not_before(workers: list[RelayWorker], dues: list[int]) -> None:
    assert not _runs(workers)  # nothing before its time
    wait_until(lambda: len(_runs(workers)) == EVENTS, 120, "every delayed event to run")
    runs = _runs(workers)
    assert Counter(len(times) for times in runs.values()) == Counter({1: EVENTS})
    for n, due in enumerate(dues):
        assert runs[n][0] >= due, (n, runs[n][0] - due)


@pytest.mark.redis
def test_three_workers_run_each_delayed_event_once_at_its_time_though_one_is_killed(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
    unique: str,
) -> None:
    _function(functions_dir)
    workers = [
        relay_worker(name=f"w{i}", env={"RELAY_HOSTNAME": f"host-{unique}-{i}"}) for i in range(3)
    ]
    dues = [delayed_due(i) or 0 for i in _publish_delayed(workers[0].admin_env)]
    assert all(dues)  # every id a delayed id, naming its due time
    workers[2].kill()  # one worker gone while every event waits
    _each_ran_once_not_before(workers, dues)


def test_three_embedded_workers_run_each_delayed_job_once_at_its_time_though_one_is_killed(
    embedded_worker: EmbeddedWorkers, functions_dir: Path, broker_file: Path
) -> None:
    _function(functions_dir)
    workers = [embedded_worker(name=f"w{i}") for i in range(3)]
    ids = _publish_delayed(admin_env(workers[0]))
    due_of = dict(broker_rows(broker_file, "SELECT created_ms || '-' || seq, ready_ms FROM jobs"))
    workers[2].kill()  # one worker gone while every job waits
    _each_ran_once_not_before(workers, [int(due_of[i]) for i in ids])
