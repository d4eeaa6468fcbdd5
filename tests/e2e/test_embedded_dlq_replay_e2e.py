"""``relay dlq replay`` on the embedded broker: an event that really exhausted its
attempts on a real ``relay start`` worker (no Redis anywhere) is dead-lettered in
the broker file, then replayed on that worker through the control socket."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from relay.adapters.sqlite.broker import jobs
from tests.e2e.embedded_support import EmbeddedWorkers, admin_env, broker_rows
from tests.e2e.flaky_function import FAILING_FOR_S, FUNCTION, write_flaky_function
from tests.e2e.harness import RelayWorker, run_relay, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.docker]



def dead_letters(path: Path) -> dict[str, tuple[str, str]]:
    """DLQ id -> (original message id, reason)."""
    found = broker_rows(path, "SELECT created_ms, seq, original_id, reason FROM dlq")
    return {jobs.message_id(ms, seq): (original, reason) for ms, seq, original, reason in found}


def publish(worker: RelayWorker, event: object) -> str:
    done = run_relay(["publish", "--event", json.dumps(event)], admin_env(worker))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def dead_letter_of(path: Path, message_id: str) -> str:
    def found() -> str | None:
        return next((k for k, (o, _) in dead_letters(path).items() if o == message_id), None)

    entry = wait_until(found, 90, f"{message_id} to be dead-lettered")
    assert isinstance(entry, str)
    return entry


def test_an_exhausted_event_replays_on_the_worker_and_a_failing_replay_keeps_its_entry(
    embedded_worker: EmbeddedWorkers, functions_dir: Path, broker_file: Path
) -> None:
    """Row 133: with ``retries: 0`` the first failure exhausts the event into the
    file's DLQ table (the job acknowledged: nothing runs it again). Replayed once
    its handler succeeds: it runs on the worker and the entry is removed. Replayed
    while the handler still fails: exit 1, one line, the entry kept. A replay is
    outside delivery: no job is added to the queue."""
    write_flaky_function(functions_dir)
    worker = embedded_worker()
    worker.wait_for(rf"msg=function_prepared function={FUNCTION} ", timeout=180)
    until = time.time() + FAILING_FOR_S
    recovers = publish(worker, {"kind": "flaky", "n": 1, "fail_until": until})
    stays = publish(worker, {"kind": "flaky", "n": 2, "fail_until": until + 3600})
    ok_entry = dead_letter_of(broker_file, recovers)
    bad_entry = dead_letter_of(broker_file, stays)
    assert dead_letters(broker_file)[ok_entry][1].startswith(
        "retries exhausted after 1 attempt(s): "
    )
    acked = broker_rows(broker_file, "SELECT count(*) FROM jobs WHERE state = 'acked'")
    assert acked == [(2,)]
    env = admin_env(worker)

    wait_until(lambda: time.time() > until, FAILING_FOR_S + 5, "fail_until to pass")
    done = run_relay(["dlq", "replay", ok_entry], env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.strip() == f"Replayed {ok_entry} ({FUNCTION}/jobs.flaky.handler); entry removed"
    )
    assert set(dead_letters(broker_file)) == {bad_entry}
    assert worker.find(r"flaky ok 1$")

    failed = run_relay(["dlq", "replay", bad_entry], env, timeout=120)
    assert failed.returncode == 1
    [line] = failed.stderr.splitlines()
    assert line.startswith(f"relay: replay of {bad_entry} failed: ")
    assert "failing until fail_until" in line
    assert line.endswith("the entry is kept")
    assert set(dead_letters(broker_file)) == {bad_entry}
    assert broker_rows(broker_file, "SELECT count(*) FROM jobs") == [(2,)]
