"""Graceful shutdown of a real ``relay start``: SIGTERM while a handler runs in a real
container. Within ``SHUTDOWN_GRACE`` the handler finishes and its message is
acknowledged; past it the claim is released, uncharged, and the message stays pending."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis

from tests.e2e.conftest import WorkerFactory
from tests.e2e.failure_support import Ledger, mark_pattern, marks, write_function
from tests.e2e.harness import RelayWorker

pytestmark = pytest.mark.e2e

SLOW = "ft.marks.slow"  # prints "mark start", sleeps 3 s, prints "mark end"


@pytest.fixture
def ledger(sync_redis: redis.Redis, worker_env: dict[str, str], functions_dir: Path) -> Ledger:
    write_function(functions_dir)
    return Ledger(sync_redis, worker_env)


def terminate(worker: RelayWorker, timeout: float = 60.0) -> int:
    """One SIGTERM, then wait for the exit (a second signal would cut the grace)."""
    assert worker.process is not None
    worker.signal(signal.SIGTERM)
    worker.process.wait(timeout=timeout)
    return worker.stop()  # already exited: returns its code, closes the pipe


def test_sigterm_lets_the_running_handler_finish_and_acknowledges_it(
    relay_worker: WorkerFactory, ledger: Ledger
) -> None:
    worker = relay_worker(env={"SHUTDOWN_GRACE": ""})  # unset: the 30 s default
    message_id = ledger.add({"kind": "slow"})
    worker.wait_for(mark_pattern(message_id, "start"), timeout=60)
    assert terminate(worker) == 0
    assert len(marks(worker, message_id, "end")) == 1  # the handler's output, after SIGTERM
    assert message_id not in ledger.pending()
    assert ledger.marker(message_id, SLOW) == "ok"
    assert len(worker.find(r"msg=shutdown_started in_flight=1 grace_s=30(\.0)?$")) == 1
    assert worker.find(r"msg=shutdown_complete")
    assert not worker.find(r"msg=shutdown_grace_expired")


def test_a_handler_that_outlives_the_grace_is_released_uncharged(
    relay_worker: WorkerFactory, ledger: Ledger
) -> None:
    worker = relay_worker(env={"SHUTDOWN_GRACE": "500ms"})
    message_id = ledger.add({"kind": "slow"})
    worker.wait_for(mark_pattern(message_id, "start"), timeout=60)
    assert ledger.marker(message_id, SLOW).startswith("running:")  # type: ignore[union-attr]
    assert terminate(worker) == 0
    assert marks(worker, message_id, "end") == []  # cancelled before it finished
    assert worker.find(r"msg=shutdown_grace_expired .*in_flight=1")
    # Released: no marker (no attempt charged), still pending for the next worker.
    assert ledger.marker(message_id, SLOW) is None
    assert message_id in ledger.pending()
    assert ledger.dlq_of(message_id) == []
