"""Failure row 150: a worker SIGKILLed with a read batch half settled.

Six messages land in one transaction, so the worker's blocked read returns them
as one batch: two slow ones (3 s handlers), two that fail without retries (each
dead-lettered at once) and two that succeed at once. Once the four quick ones are
settled (acknowledged, their DLQ entries written) and the slow ones are running,
the worker is SIGKILLed: the batch is half settled. A second worker takes the
slow ones over once their claims expire. Nothing is lost, nothing settled runs
again, and each exhausted invocation has exactly one DLQ entry.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from tests.e2e.conftest import WorkerFactory
from tests.e2e.failure_support import (
    FAST_RECOVERY,
    FUNCTION,
    SLOW_TIMEOUT_S,
    Ledger,
    limit_concurrency,
    mark_pattern,
    marks,
    write_function,
)
from tests.e2e.harness import wait_until

pytestmark = pytest.mark.e2e

SLOW = "ft.marks.slow"
NO_RETRY = "ft.marks.no_retry"
ECHO = "ft.marks.echo"
TAKEOVER_S = SLOW_TIMEOUT_S + 15 + 45  # lease (timeout + slot wait + grace), generous
WINDOW_S = 3.0


@pytest.fixture
def ledger(sync_redis: redis.Redis, worker_env: dict[str, str], functions_dir: Path) -> Ledger:
    write_function(functions_dir)
    limit_concurrency(functions_dir, 8)  # the whole batch runs at once
    return Ledger(sync_redis, worker_env)


def add_together(ledger: Ledger, events: list[dict[str, str]]) -> list[str]:
    """XADD every event in one MULTI/EXEC: a blocked XREADGROUP sees them at once."""
    pipe = ledger.client.pipeline(transaction=True)
    for event in events:
        pipe.xadd(ledger.stream, {"event": json.dumps(event)})
    return [raw.decode() for raw in pipe.execute()]


def test_sigkill_with_a_batch_half_settled_loses_nothing_and_dead_letters_once(
    relay_worker: WorkerFactory, worker_env: dict[str, str], ledger: Ledger
) -> None:
    first = relay_worker(name="a", env=FAST_RECOVERY)
    kinds = ["slow", "fail-no-retry", "ok", "slow", "fail-no-retry", "ok"]
    ids = add_together(ledger, [{"kind": k} for k in kinds])
    slow = [i for i, k in zip(ids, kinds, strict=True) if k == "slow"]
    failed = [i for i, k in zip(ids, kinds, strict=True) if k == "fail-no-retry"]
    quick = [i for i in ids if i not in slow]
    for message_id in slow:
        first.wait_for(mark_pattern(message_id, "start"), timeout=60)
    wait_until(
        lambda: not set(quick) & ledger.pending(), 30, "the quick half of the batch to settle"
    )
    assert set(slow) <= ledger.pending(), "the slow half was settled before the kill"
    first.kill()
    killed_at = time.time()
    for message_id in slow:
        assert not marks(first, message_id, "end"), "a slow handler finished before the kill"

    second = relay_worker(
        name="b", env={**FAST_RECOVERY, "RELAY_HOSTNAME": worker_env["RELAY_HOSTNAME"] + "-b"}
    )
    wait_until(lambda: not ledger.pending(), TAKEOVER_S, "every message to be acknowledged")

    # lost 0: every message ended, the slow ones by a run after the kill
    for message_id in slow:
        assert ledger.marker(message_id, SLOW) == "ok"
        [late] = marks(second, message_id, "end")
        assert late.at > killed_at
    for message_id in quick:  # settled before the kill: never run again
        assert len(marks(first, message_id)) == 1
        assert marks(second, message_id) == []
    # one DLQ entry per exhausted invocation, none for anything else
    dlq = ledger.dlq()
    assert sorted(e["original_id"] for e in dlq) == sorted(failed)
    assert {(e["function"], e["handler"]) for e in dlq} == {(FUNCTION, NO_RETRY)}
    for message_id in failed:
        assert ledger.marker(message_id, NO_RETRY) == "exhausted:1:dlq"
    end = time.monotonic() + WINDOW_S
    while time.monotonic() < end:
        assert len(ledger.dlq()) == len(failed), "a DLQ entry was written twice"
        assert not ledger.pending()
        time.sleep(0.05)
