"""The failure table (docs/failure-semantics.md), row by row, against the real system.

Each test runs ``relay start`` (one or two workers), a real Redis and real execution
containers, and asserts only what it can see from outside: the handlers' marks in
the worker output (see ``failure_support``), the worker's log lines, the ledger
hash, the pending list, the dead-letter stream and ``/metrics``. Negative claims
("never ran again", "still pending") hold over a sustained window, not after a sleep.
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from tests.e2e.conftest import WorkerFactory
from tests.e2e.failure_support import (
    CONTAINER_GRACE_S,
    FAST_RECOVERY,
    FUNCTION,
    SLOW_TIMEOUT_S,
    Ledger,
    free_port,
    limit_concurrency,
    mark_pattern,
    marks,
    metric,
    running_deadline_s,
    write_function,
)
from tests.e2e.harness import run_relay, wait_until

pytestmark = pytest.mark.e2e

SLOW = "ft.marks.slow"
# A claim's lease: the rule timeout + the 10 s slot wait + 5 s grace (dispatch.py).
LEASE_S = SLOW_TIMEOUT_S + 15
TAKEOVER_S = LEASE_S + 45  # generous: the test bed's 2 cores may be busy with benches
WINDOW_S = 3.0  # a sustained window: several 1 s recovery passes


@pytest.fixture
def ledger(sync_redis: redis.Redis, worker_env: dict[str, str], functions_dir: Path) -> Ledger:
    write_function(functions_dir)
    return Ledger(sync_redis, worker_env)


def holds(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Assert ``condition`` on every poll for ``seconds`` (a negative claim)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert condition(), what
        time.sleep(0.05)


def test_sigkill_mid_invocation_another_worker_completes_after_the_claim_expires(
    relay_worker: WorkerFactory, worker_env: dict[str, str], ledger: Ledger
) -> None:
    """Row 1: a worker SIGKILLed while its handler runs; a second worker (same group,
    another hostname) runs the next attempt only after the first claim's deadline,
    which outlasts the first container's own kill deadline: the two never overlap.
    The message completes and is acknowledged; nothing is dead-lettered."""
    first = relay_worker(name="a", env=FAST_RECOVERY)
    message_id = ledger.add({"kind": "slow"})
    first.wait_for(mark_pattern(message_id, "start"), timeout=30)
    deadline_s, attempt = running_deadline_s(ledger.marker(message_id, SLOW))
    assert attempt == 1
    first.kill()
    [first_start] = marks(first, message_id, "start")
    assert not marks(first, message_id, "end"), "killed before the handler finished"

    second = relay_worker(
        name="b", env={**FAST_RECOVERY, "RELAY_HOSTNAME": worker_env["RELAY_HOSTNAME"] + "-b"}
    )
    second.wait_for(mark_pattern(message_id, "end"), timeout=TAKEOVER_S)
    wait_until(lambda: message_id not in ledger.pending(), 15, "the message to be acked")

    [second_start] = marks(second, message_id, "start")
    # The first container kills itself at timeout + grace, inside the claim's lease ...
    assert first_start.at + SLOW_TIMEOUT_S + CONTAINER_GRACE_S < deadline_s
    # ... and the takeover started only once that lease had expired: no overlap.
    assert second_start.at >= deadline_s
    assert second_start.container != first_start.container
    # the log goes through a writer thread: wait for the line, it may trail the ack
    [succeeded] = second.wait_for(rf"msg=invocation_succeeded .*message_id={message_id}")
    assert " attempt=2 " in f"{succeeded} "
    assert ledger.marker(message_id, SLOW) == "ok"
    holds(
        lambda: len(marks(second, message_id, "start")) == 1 and message_id not in ledger.pending(),
        WINDOW_S,
        "the completed message ran again or came back",
    )
    assert ledger.dlq_of(message_id) == []


def test_a_crash_after_the_side_effect_runs_the_handler_again(
    relay_worker: WorkerFactory,
    worker_env: dict[str, str],
    ledger: Ledger,
    docker_client: Any,
) -> None:
    """Row 2, the at-least-once window: the handler's side effect happened (its
    container printed ``end``) but the worker died before recording it (frozen,
    then SIGKILLed). After the claim expires another worker runs it again: the side
    effect happens twice, the second run is attempt 2, and the message is acked."""
    first = relay_worker(name="a", env=FAST_RECOVERY)
    message_id = ledger.add({"kind": "slow"})
    first.wait_for(mark_pattern(message_id, "start"), timeout=30)
    [started] = marks(first, message_id, "start")
    first.signal(signal.SIGSTOP)  # the worker never reads the result ...
    container = docker_client.containers.get(started.container)

    def side_effect_done() -> bool:
        return b"mark end " in container.logs()

    wait_until(side_effect_done, 30, "the first run's side effect")
    first.kill()  # ... and dies before recording it
    assert (ledger.marker(message_id, SLOW) or "").startswith("running:"), "nothing recorded"

    second = relay_worker(
        name="b", env={**FAST_RECOVERY, "RELAY_HOSTNAME": worker_env["RELAY_HOSTNAME"] + "-b"}
    )
    second.wait_for(mark_pattern(message_id, "end"), timeout=TAKEOVER_S)
    wait_until(lambda: message_id not in ledger.pending(), 15, "the message to be acked")
    # the log goes through a writer thread: wait for the line, it may trail the ack
    [succeeded] = second.wait_for(rf"msg=invocation_succeeded .*message_id={message_id}")
    assert " attempt=2 " in f"{succeeded} "
    assert ledger.marker(message_id, SLOW) == "ok"
    assert ledger.dlq_of(message_id) == []


def test_sigstop_past_the_deadline_the_late_result_is_fenced(
    relay_worker: WorkerFactory, worker_env: dict[str, str], ledger: Ledger
) -> None:
    """Rows 3 and 4: a worker frozen (SIGSTOP) mid-invocation past its claim's
    deadline; another worker takes over and completes (``ok``, acked). Resumed
    (SIGCONT), the frozen worker reports its attempt's failure with the old token:
    the ledger rejects it (``invocation_fenced``), the marker keeps the newer
    attempt's ``ok``, and the stale failure is neither scheduled nor counted."""
    port = free_port()
    first = relay_worker(name="a", env={**FAST_RECOVERY, "METRICS_ADDR": f"127.0.0.1:{port}"})
    # The first attempt (now) fails; the takeover (after the ~19 s lease) succeeds.
    message_id = ledger.add({"kind": "slow", "fail_until": time.time() + 12})
    first.wait_for(mark_pattern(message_id, "start"), timeout=30)
    deadline_s, _ = running_deadline_s(ledger.marker(message_id, SLOW))
    first.signal(signal.SIGSTOP)
    try:
        second = relay_worker(
            name="b",
            env={**FAST_RECOVERY, "RELAY_HOSTNAME": worker_env["RELAY_HOSTNAME"] + "-b"},
        )
        second.wait_for(mark_pattern(message_id, "end"), timeout=TAKEOVER_S)
        wait_until(lambda: message_id not in ledger.pending(), 15, "the takeover's ack")
        assert marks(second, message_id, "start")[0].at >= deadline_s
        assert ledger.marker(message_id, SLOW) == "ok"
    finally:
        first.signal(signal.SIGCONT)

    [fenced] = first.wait_for(rf"msg=invocation_fenced .*message_id={message_id}", timeout=30)
    assert "attempt=1" in fenced
    assert ledger.marker(message_id, SLOW) == "ok", "the stale report overwrote the marker"
    # The late result is not reported as a success or a retry: only the fence line.
    assert not first.find(rf"msg=invocation_(succeeded|failed|exhausted) .*message_id={message_id}")
    holds(
        lambda: (
            message_id not in ledger.pending()
            and len(marks(first, message_id, "start")) == 1
            and len(marks(second, message_id, "start")) == 1
        ),
        WINDOW_S,
        "the message came back or ran again",
    )
    assert ledger.dlq_of(message_id) == []
    # The rejected failure was not counted as a failure or a scheduled retry.
    assert metric(port, "handler_failure_total") == 0
    assert metric(port, "retries_total") == 0


def test_redis_restart_the_worker_recovers_and_loses_nothing(
    relay_worker: WorkerFactory,
    worker_env: dict[str, str],
    functions_dir: Path,
    restartable_redis: Any,
) -> None:
    """Row 6: Redis stops and starts again (empty: no persistence) under a running
    worker. The consumer logs one line when reads fail and one when they work again,
    the process keeps running, and every event sent before and after is handled
    exactly once."""
    write_function(functions_dir)
    # The production recovery cadence (1m): every event must be handled by the
    # consumer itself, none may wait for the recovery loop.
    env = {"REDIS_URI": restartable_redis.url}
    worker = relay_worker(env=env)
    before_client = redis.Redis.from_url(restartable_redis.url)
    try:
        before = [Ledger(before_client, worker_env).add({"kind": "ok"}) for _ in range(3)]
        for message_id in before:
            worker.wait_for(mark_pattern(message_id, "run"), timeout=30)
        wait_until(lambda: not Ledger(before_client, worker_env).pending(), 15, "acks")
    finally:
        before_client.close()

    restartable_redis.stop()
    worker.wait_for(r"msg=broker_unavailable .*loop=consumer|loop=consumer.*broker_unavailable")
    restartable_redis.start()
    worker.wait_for(r"msg=broker_recovered .*loop=consumer|loop=consumer.*broker_recovered")

    after_client = redis.Redis.from_url(restartable_redis.url)
    try:
        ledger = Ledger(after_client, worker_env)
        after = [ledger.add({"kind": "ok"}) for _ in range(3)]
        for message_id in after:
            worker.wait_for(mark_pattern(message_id, "run"), timeout=30)
        wait_until(lambda: not ledger.pending(), 15, "the acks after the restart")
        for message_id in after:
            assert ledger.marker(message_id, "ft.marks.echo") == "ok"
    finally:
        after_client.close()
    assert worker.process is not None
    assert worker.process.poll() is None, "the worker exited"
    assert len(worker.find(r"broker_unavailable.*loop=consumer")) == 1
    assert len(worker.find(r"broker_recovered.*loop=consumer")) == 1
    # Connections the restart closed are replaced on use: no claim failed after it.
    assert worker.find(r"msg=ledger_unavailable") == []
    for message_id in before + after:
        assert len(marks(worker, message_id, "run")) == 1


def test_a_frozen_redis_mid_invocation_is_waited_out_and_nothing_is_lost(
    relay_worker: WorkerFactory,
    worker_env: dict[str, str],
    functions_dir: Path,
    restartable_redis: Any,
) -> None:
    """Row 7: Redis stops answering (the container is paused: connections stay open,
    nothing replies) while a handler runs. The consumer logs ``broker_unavailable``
    once, keeps retrying, and ``broker_recovered`` once Redis answers again; the
    invocation's result is recorded and the message acknowledged after the outage,
    it ran once, and an event sent afterwards is handled as usual."""
    write_function(functions_dir)
    worker = relay_worker(env={"REDIS_URI": restartable_redis.url})
    client = redis.Redis.from_url(restartable_redis.url)
    try:
        ledger = Ledger(client, worker_env)
        message_id = ledger.add({"kind": "slow"})
        worker.wait_for(mark_pattern(message_id, "start"), timeout=30)
        restartable_redis.pause()
        try:
            # A read is given up after its block time plus 10 s.
            worker.wait_for(r"msg=broker_unavailable .*loop=consumer", timeout=40)
        finally:
            restartable_redis.unpause()
        worker.wait_for(r"msg=broker_recovered .*loop=consumer", timeout=40)
        worker.wait_for(mark_pattern(message_id, "end"), timeout=30)
        wait_until(lambda: message_id not in ledger.pending(), 40, "the ack after the outage")
        assert ledger.marker(message_id, SLOW) == "ok"

        after = ledger.add({"kind": "ok"})
        worker.wait_for(mark_pattern(after, "run"), timeout=30)
        wait_until(lambda: not ledger.pending(), 15, "the ack of the later event")
    finally:
        client.close()
    assert worker.process is not None
    assert worker.process.poll() is None, "the worker exited"
    assert len(worker.find(r"msg=broker_unavailable .*loop=consumer")) == 1
    assert len(worker.find(r"msg=broker_recovered .*loop=consumer")) == 1
    assert len(marks(worker, message_id, "start")) == 1


def test_a_frozen_redis_past_the_lease_applies_the_result_it_was_sent_on_waking(
    relay_worker: WorkerFactory,
    worker_env: dict[str, str],
    functions_dir: Path,
    restartable_redis: Any,
) -> None:
    """Row 7, a longer freeze: Redis stops answering while a handler runs and stays
    frozen past the claim's lease and past the script call's own 30 s timeout, so
    the worker gives the result up (``ledger_unavailable``). But the call had been
    written: the frozen server's kernel kept it, and Redis runs it on waking. Its
    token still matches (nobody could take the claim over meanwhile), so the
    result counts: the handler ran once, the message is acknowledged, no rerun."""
    write_function(functions_dir)
    worker = relay_worker(env={"REDIS_URI": restartable_redis.url, **FAST_RECOVERY})
    client = redis.Redis.from_url(restartable_redis.url)
    try:
        ledger = Ledger(client, worker_env)
        message_id = ledger.add({"kind": "slow"})
        worker.wait_for(mark_pattern(message_id, "start"), timeout=30)
        deadline_s, _ = running_deadline_s(ledger.marker(message_id, SLOW))
        restartable_redis.pause()
        try:
            worker.wait_for(mark_pattern(message_id, "end"), timeout=30)
            worker.wait_for(
                rf"msg=ledger_unavailable message_id={re.escape(message_id)} ", timeout=60
            )
            assert time.time() > deadline_s, "the lease should have run out by now"
        finally:
            restartable_redis.unpause()
        wait_until(lambda: message_id not in ledger.pending(), 40, "the ack on waking")
        assert ledger.marker(message_id, SLOW) == "ok"
        holds(lambda: len(marks(worker, message_id, "start")) == 1, WINDOW_S, "ran again")
        assert ledger.dlq_of(message_id) == []
    finally:
        client.close()
    assert worker.process is not None
    assert worker.process.poll() is None, "the worker exited"


def test_redis_down_past_the_lease_runs_the_invocation_again_and_loses_nothing(
    relay_worker: WorkerFactory,
    worker_env: dict[str, str],
    functions_dir: Path,
    persistent_redis: Any,
) -> None:
    """Row 7, a longer outage: Redis crashes while a handler runs (its data is on
    disk) and stays down past the claim's lease. The result cannot be recorded
    (``ledger_unavailable``); once Redis is back, recovery hands the message back,
    the expired claim is taken again as attempt 2, and the message is acknowledged:
    the handler ran twice (at least once, never lost), no DLQ entry, worker up."""
    write_function(functions_dir)
    worker = relay_worker(env={"REDIS_URI": persistent_redis.url, **FAST_RECOVERY})
    client = redis.Redis.from_url(persistent_redis.url)
    try:
        ledger = Ledger(client, worker_env)
        message_id = ledger.add({"kind": "slow"})
        worker.wait_for(mark_pattern(message_id, "start"), timeout=30)
        deadline_s, attempt = running_deadline_s(ledger.marker(message_id, SLOW))
        assert attempt == 1
        persistent_redis.kill()
        try:
            worker.wait_for(mark_pattern(message_id, "end"), timeout=30)
            worker.wait_for(
                rf"msg=ledger_unavailable message_id={re.escape(message_id)} ", timeout=30
            )
            wait_until(lambda: time.time() > deadline_s + 1, LEASE_S + 5, "the lease's end")
        finally:
            persistent_redis.start()
        worker.wait_for(mark_pattern(message_id, "start"), timeout=60, count=2)
        wait_until(lambda: message_id not in ledger.pending(), 40, "the ack after the rerun")
        assert ledger.marker(message_id, SLOW) == "ok"
        assert ledger.dlq_of(message_id) == []
    finally:
        client.close()
    assert worker.process is not None
    assert worker.process.poll() is None, "the worker exited"
    assert len(marks(worker, message_id, "start")) == 2  # once lost, once recorded
    [succeeded] = worker.wait_for(
        rf"msg=invocation_succeeded .*message_id={re.escape(message_id)} attempt=2 "
    )
    assert succeeded


def test_an_always_failing_handler_runs_one_plus_retries_times_then_one_dlq_entry(
    relay_worker: WorkerFactory, ledger: Ledger
) -> None:
    """Row 8: ``retries: 2`` gives exactly three executions (each backoff deadline is
    moved to the past in the ledger instead of waiting 1m and 2m), then one DLQ entry
    with ``handler_attempts`` 3, then the ACK; nothing runs afterwards. Row 23: the
    three deliveries classified the event once (``/metrics``)."""
    handler = "ft.marks.always_fail"
    port = free_port()
    worker = relay_worker(env={**FAST_RECOVERY, "METRICS_ADDR": f"127.0.0.1:{port}"})
    message_id = ledger.add({"kind": "fail"})
    for attempt in (1, 2):
        worker.wait_for(mark_pattern(message_id, "run"), timeout=30, count=attempt)
        wait_until(
            lambda a=attempt: ledger.expire_backoff(message_id, handler, a),  # type: ignore[misc]
            30,
            f"attempt {attempt}'s backoff marker",
        )
    wait_until(lambda: ledger.dlq_of(message_id), 30, "the DLQ entry")
    wait_until(lambda: message_id not in ledger.pending(), 15, "the ack")

    [entry] = ledger.dlq_of(message_id)
    assert (entry["function"], entry["handler"], entry["handler_attempts"]) == (
        FUNCTION,
        handler,
        "3",
    )
    assert json.loads(entry["event"]) == {"kind": "fail"}
    assert ledger.marker(message_id, handler) == "exhausted:3:dlq"
    holds(
        lambda: len(marks(worker, message_id, "run")) == 3 and len(ledger.dlq_of(message_id)) == 1,
        WINDOW_S,
        "an exhausted invocation ran again or was dead-lettered twice",
    )
    assert len(worker.find(rf"msg=invocation_failed .*message_id={message_id}")) == 2
    counts = {
        name: metric(port, f"{name}_total")
        for name in ("events_received", "events_matched", "events_unmatched", "handler_failure")
    }
    assert counts == {
        "events_received": 1,
        "events_matched": 1,
        "events_unmatched": 0,
        "handler_failure": 3,
    }


def test_two_matched_handlers_one_failing_the_success_is_never_rerun(
    relay_worker: WorkerFactory, ledger: Ledger
) -> None:
    """Row 9: one event matches a handler that succeeds and one that always fails
    (``retries: 2``). The success is recorded ``ok`` once and never runs again while
    the failing one retries; the message is acknowledged only after the failing one
    is exhausted and dead-lettered (one entry, for that handler only)."""
    failing, succeeding = "ft.marks.always_fail", "ft.marks.echo"
    worker = relay_worker(env=FAST_RECOVERY)
    message_id = ledger.add({"kind": "pair"})
    worker.wait_for(mark_pattern(message_id, "run"), timeout=30, count=2)
    wait_until(lambda: ledger.marker(message_id, succeeding) == "ok", 15, "the success")
    for attempt in (1, 2):
        backoff = re.compile(rf"next_attempt_at:\d+#{attempt}")
        wait_until(
            lambda b=backoff: b.fullmatch(ledger.marker(message_id, failing) or ""),  # type: ignore[misc]
            30,
            f"attempt {attempt}'s backoff marker",
        )
        assert message_id in ledger.pending(), "acknowledged while an invocation retries"
        assert ledger.expire_backoff(message_id, failing, attempt)
    wait_until(lambda: message_id not in ledger.pending(), 30, "the ack after exhaustion")

    [entry] = ledger.dlq_of(message_id)
    assert (entry["handler"], entry["handler_attempts"]) == (failing, "3")
    assert ledger.marker(message_id, succeeding) == "ok"
    assert ledger.marker(message_id, failing) == "exhausted:3:dlq"
    holds(
        lambda: (
            len(marks(worker, message_id, handler=succeeding)) == 1
            and len(marks(worker, message_id, handler=failing)) == 3
        ),
        WINDOW_S,
        "a handler ran more often than its attempts",
    )


def test_a_removed_handler_no_longer_holds_back_the_ack(
    relay_worker: WorkerFactory, ledger: Ledger, functions_dir: Path
) -> None:
    """Row 18: one event matches a handler that succeeds and one that fails and
    waits out its backoff, so the message stays pending. The operator removes the
    failing rule from the template; the live reload swaps the rules, and the next
    delivery acknowledges the message on the remaining handler alone, without
    running either handler again and without a DLQ entry."""
    failing, succeeding = "ft.marks.always_fail", "ft.marks.echo"
    worker = relay_worker(env=FAST_RECOVERY)
    message_id = ledger.add({"kind": "pair"})
    wait_until(lambda: ledger.marker(message_id, succeeding) == "ok", 30, "the success")
    wait_until(
        lambda: re.fullmatch(r"next_attempt_at:\d+#1", ledger.marker(message_id, failing) or ""),
        30,
        "the failure's backoff marker",
    )
    holds(lambda: message_id in ledger.pending(), WINDOW_S, "acknowledged during the backoff")

    template = functions_dir / FUNCTION / "template.yaml"
    rule = (
        "  - handler: ft.marks.always_fail\n    pattern:\n      kind: [fail, pair]\n"
        "    retries: 2\n"
    )
    assert rule in template.read_text()
    template.write_text(template.read_text().replace(rule, ""))
    worker.wait_for(rf"msg=function_prepared function={FUNCTION} ", timeout=120, count=2)
    wait_until(lambda: message_id not in ledger.pending(), 30, "the ack without the rule")

    assert ledger.dlq_of(message_id) == []
    holds(
        lambda: (
            len(marks(worker, message_id, handler=succeeding)) == 1
            and len(marks(worker, message_id, handler=failing)) == 1
        ),
        WINDOW_S,
        "a handler ran again",
    )


def test_no_slot_within_the_wait_defers_without_an_attempt_and_runs_later(
    relay_worker: WorkerFactory, ledger: Ledger, functions_dir: Path
) -> None:
    """Row 15: with ``concurrency: 1`` and five 3-second invocations claimed at once,
    the last ones cannot get the function's slot within the 10 s wait. Each of those
    is released (``invocation_deferred``, no attempt charged) and left pending;
    recovery hands it back and it runs once, as attempt 1. Every event runs exactly
    once and is acknowledged; ``concurrency_waits_total`` counts the waits."""
    limit_concurrency(functions_dir, 1)
    port = free_port()
    worker = relay_worker(env={**FAST_RECOVERY, "METRICS_ADDR": f"127.0.0.1:{port}"})
    ids = [ledger.add({"kind": "slow"}) for _ in range(5)]
    worker.wait_for(r"msg=invocation_deferred .*reason=slot_unavailable", timeout=60)
    wait_until(lambda: not set(ids) & ledger.pending(), 90, "every ack")

    deferred = {
        m[1]
        for line in worker.find(r"msg=invocation_deferred ")
        if (m := re.search(r"message_id=(\S+)", line)) is not None
    }
    assert deferred <= set(ids)
    for message_id in ids:
        assert ledger.marker(message_id, SLOW) == "ok"
        assert len(marks(worker, message_id, "start")) == 1, message_id
    for message_id in deferred:  # released, so its only run is attempt 1
        assert worker.find(
            rf"msg=invocation_succeeded .*message_id={re.escape(message_id)} attempt=1 "
        ), message_id
    waits = metric(port, "concurrency_waits_total")
    assert waits is not None
    assert waits >= 4


def test_a_full_buffer_leaves_the_backlog_in_redis(
    relay_worker: WorkerFactory, ledger: Ledger, functions_dir: Path
) -> None:
    """Row 21: ``MAX_BUFFERED_EVENTS=2`` and ten 3-second events at ``concurrency: 1``.
    The worker holds at most two messages at any time (the group's pending list);
    the rest stay undelivered in the stream (the group's lag) and are read as
    room frees up, in order."""
    limit_concurrency(functions_dir, 1)
    relay_worker(env={"MAX_BUFFERED_EVENTS": "2"})
    ids = [ledger.add({"kind": "slow"}) for _ in range(10)]

    def group() -> dict[str, Any]:
        [info] = ledger.client.xinfo_groups(ledger.stream)
        return {k.decode() if isinstance(k, bytes) else k: v for k, v in info.items()}

    wait_until(lambda: group()["pending"] == 2, 30, "two messages taken")
    holds(
        lambda: group()["pending"] <= 2 and group()["lag"] >= 10 - 2 - 2,
        WINDOW_S,
        "the worker took more than its buffer, or read nothing more",
    )
    wait_until(
        lambda: ids[2] not in ledger.pending() and ledger.marker(ids[2], SLOW) == "ok",
        60,
        "the third event, read once room freed up",
    )
    assert group()["pending"] <= 2


NOT_READY = "not-ready"
NOT_READY_TEMPLATE = """\
runtime: python3.14
events:
  - handler: handler.handler
    pattern:
      kind: [held]
"""
NOT_READY_HANDLER = """\
import time

import six


def handler(event):
    print(f"mark run {time.time():.6f} six-{six.__version__}", flush=True)
"""


def test_a_function_without_an_image_holds_its_events_until_it_serves(
    relay_worker: WorkerFactory, ledger: Ledger, functions_dir: Path
) -> None:
    """Row 14: a function whose first image cannot be built yet (here its
    requirements do not install) is in the catalog as pending, so an event it
    matches is classified, neither run nor acknowledged, and no attempt is
    charged. Once the function is fixed and built, recovery hands the event over
    and it runs once, as attempt 1."""
    fn = functions_dir / NOT_READY
    fn.mkdir()
    (fn / "template.yaml").write_text(NOT_READY_TEMPLATE)
    (fn / "handler.py").write_text(NOT_READY_HANDLER)
    (fn / "requirements.txt").write_text("six ==== not a version\n")
    worker = relay_worker(env=FAST_RECOVERY)
    worker.wait_for(rf"msg=function_reconcile_failed function={NOT_READY} ", timeout=180)
    message_id = ledger.add({"kind": "held"})
    field = f"{NOT_READY}/handler.handler"

    def held() -> bool:
        ledger_hash = ledger.client.hgetall(ledger.key(message_id))
        return (
            message_id in ledger.pending()
            and ledger_hash.get(b"@class", b"").startswith(f"matched:{NOT_READY}#".encode())
            and field.encode() not in ledger_hash  # no claim, so no attempt charged
        )

    wait_until(held, 15, "the event classified and held")
    holds(held, WINDOW_S, "the held event ran, was charged or was acknowledged")
    assert not worker.find(mark_pattern(message_id, "run"))

    (fn / "requirements.txt").write_text("six==1.16.0\n")
    worker.wait_for(rf"msg=function_prepared function={NOT_READY} ", timeout=180)
    worker.wait_for(mark_pattern(message_id, "run"), timeout=30)
    wait_until(lambda: message_id not in ledger.pending(), 15, "the ack once it served")
    assert ledger.client.hget(ledger.key(message_id), field) == b"ok"
    assert len(worker.find(mark_pattern(message_id, "run"))) == 1
    assert worker.find(
        rf"msg=invocation_succeeded function={NOT_READY} .*message_id={re.escape(message_id)} "
        "attempt=1 "
    )


def test_an_unwritable_dlq_keeps_the_message_pending_then_routes_it_without_rerunning(
    relay_worker: WorkerFactory, ledger: Ledger, sync_redis: redis.Redis
) -> None:
    """Row 10: the DLQ key holds a string, so XADD fails (WRONGTYPE) when the only
    attempt is exhausted: the message stays pending through several recovery passes.
    Once the key is gone, the next pass writes the entry and acknowledges, without
    running the handler again."""
    handler = "ft.marks.no_retry"
    dlq = f"relay:{ledger.stream}:dlq"
    sync_redis.set(dlq, "not a stream")
    worker = relay_worker(env=FAST_RECOVERY)
    message_id = ledger.add({"kind": "fail-no-retry"})
    worker.wait_for(mark_pattern(message_id, "run"), timeout=30)
    # The first settle and at least one redelivery by recovery both fail to write.
    worker.wait_for(rf"msg=dead_letter_write_failed .*message_id={message_id}", count=2)
    holds(
        lambda: (
            message_id in ledger.pending() and ledger.marker(message_id, handler) == "exhausted:1"
        ),
        WINDOW_S,
        "the message left the pending list while its DLQ entry could not be written",
    )

    sync_redis.delete(dlq)
    wait_until(lambda: message_id not in ledger.pending(), 15, "the ack once the DLQ is writable")
    [entry] = ledger.dlq_of(message_id)
    assert (entry["handler"], entry["handler_attempts"]) == (handler, "1")
    assert ledger.marker(message_id, handler) == "exhausted:1:dlq"
    holds(
        lambda: len(marks(worker, message_id, "run")) == 1,
        WINDOW_S,
        "the handler ran again",
    )


def test_an_ack_refused_after_the_dlq_write_is_retried_without_a_second_entry(
    relay_worker: WorkerFactory,
    ledger: Ledger,
    sync_redis: redis.Redis,
    worker_env: dict[str, str],
) -> None:
    """Row 11: the settling script writes the DLQ entry and its ``:dlq`` marker, then
    its XACK fails. Here a Redis ACL denies the worker's user XACK only, so the
    script stops at exactly that step (a script's earlier writes stay). Every
    later delivery finds the entry written and only retries the XACK: no second
    entry, no second run. Once XACK is allowed, the next pass acknowledges."""
    handler = "ft.marks.no_retry"
    user, password = f"relay-{ledger.group}", secrets.token_hex(8)
    sync_redis.acl_setuser(
        user,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-xack"],
    )
    try:
        parts = urlsplit(worker_env["REDIS_URI"])
        uri = parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}")
        worker = relay_worker(env={**FAST_RECOVERY, "REDIS_URI": urlunsplit(uri)})
        message_id = ledger.add({"kind": "fail-no-retry"})
        worker.wait_for(mark_pattern(message_id, "run"), timeout=30)
        # the first settle (finish) and at least one redelivery (begin) are refused,
        # and the log says by what
        worker.wait_for(
            rf"msg=ledger_unavailable .*message_id={message_id}.*can't run this command", count=2
        )
        holds(
            lambda: (
                message_id in ledger.pending()
                and ledger.marker(message_id, handler) == "exhausted:1:dlq"
                and len(ledger.dlq_of(message_id)) == 1
            ),
            WINDOW_S,
            "the entry was not written before the refused XACK, or was written twice",
        )
        trace = run_relay(["trace", message_id], worker.admin_env)
        assert trace.returncode == 0, trace.stderr
        assert "its DLQ entry is written" in trace.stdout
        assert "every invocation is finished but the acknowledgment failed" in trace.stdout

        sync_redis.acl_setuser(user, enabled=True, commands=["+xack"])
        wait_until(lambda: message_id not in ledger.pending(), 15, "the ack once XACK is allowed")
        [entry] = ledger.dlq_of(message_id)
        assert (entry["handler"], entry["handler_attempts"]) == (handler, "1")
        holds(
            lambda: (
                len(marks(worker, message_id, "run")) == 1 and len(ledger.dlq_of(message_id)) == 1
            ),
            WINDOW_S,
            "the handler ran again or a second entry was written",
        )
    finally:
        sync_redis.acl_deluser(user)


def test_malformed_and_oversized_events_are_dead_lettered_at_once(
    relay_worker: WorkerFactory, ledger: Ledger
) -> None:
    """Row 12: not JSON, not a JSON object, not UTF-8, no ``event`` field, and larger
    than ``MAX_EVENT_BYTES`` (1 KiB here): each gets one placeholder DLQ entry
    (``-``, ``-``, ``handler_attempts`` 0) and is acknowledged; no handler runs and
    ``events_received_total`` does not move (a valid event afterwards moves it).
    Row 22 follows: an event no rule matches."""
    port = free_port()
    worker = relay_worker(env={"MAX_EVENT_BYTES": "1KiB", "METRICS_ADDR": f"127.0.0.1:{port}"})
    wait_until(lambda: metric(port, "events_received_total") == 0, 15, "/metrics")
    bad = [
        ledger.add("not json {"),
        ledger.add("[1, 2]"),
        ledger.add(b"\xff\xfe{"),
        ledger.add_fields({"payload": json.dumps({"kind": "ok"})}),
        ledger.add({"kind": "ok", "pad": "x" * 2000}),
    ]
    wait_until(lambda: all(ledger.dlq_of(i) for i in bad), 30, "a DLQ entry for each")
    wait_until(lambda: not set(bad) & ledger.pending(), 15, "their acks")
    for message_id in bad:
        [entry] = ledger.dlq_of(message_id)
        assert (entry["function"], entry["handler"], entry["handler_attempts"]) == ("-", "-", "0")
        assert not marks(worker, message_id)
    assert len(worker.find(r"msg=event_malformed")) == len(bad)
    assert metric(port, "events_received_total") == 0

    good = ledger.add({"kind": "ok"})
    worker.wait_for(mark_pattern(good, "run"), timeout=30)
    wait_until(lambda: metric(port, "events_received_total") == 1, 15, "the valid event counted")
    assert metric(port, "dlq_entries_total") == len(bad)

    # Row 22: a valid event no rule matches is acknowledged at once and counted
    # unmatched; nothing runs and nothing is dead-lettered.
    unmatched = ledger.add({"kind": "nobody-listens"})
    wait_until(lambda: metric(port, "events_unmatched_total") == 1, 15, "the unmatched count")
    wait_until(lambda: unmatched not in ledger.pending(), 15, "the unmatched event's ack")
    assert (metric(port, "events_received_total"), metric(port, "events_matched_total")) == (2, 1)
    # the classification, and the token of the call that wrote it
    assert (ledger.client.hget(ledger.key(unmatched), "@class") or b"").startswith(b"unmatched#")
    assert not worker.find(rf'message "{re.escape(unmatched)}"')
    assert ledger.dlq_of(unmatched) == []


def test_retention_never_trims_a_pending_entry_older_than_the_window(
    relay_worker: WorkerFactory, ledger: Ledger
) -> None:
    """Row 19: ``REDIS_STREAM_RETENTION=1s``; the stream holds 200 acknowledged entries
    and, after them, one entry still pending (read by a consumer that never acks).
    The worker's first trim pass (5 s after start) is clamped to that entry: older
    acknowledged entries go, the pending one stays, still pending."""
    stream, group = ledger.stream, ledger.group
    client = ledger.client
    client.xgroup_create(stream, group, id="0", mkstream=True)
    acked = [ledger.add({"kind": "none", "n": n}) for n in range(200)]
    pending_id = ledger.add({"kind": "ok"})
    read = client.xreadgroup(group, "ghost", {stream: ">"}, count=201)
    assert len(read[0][1]) == 201
    client.xack(stream, group, *acked)
    assert ledger.pending() == {pending_id}

    worker = relay_worker(env={"REDIS_STREAM_RETENTION": "1s"})
    [line] = worker.wait_for(r"msg=stream_trimmed", timeout=30)
    if "mode=clamped" in line:  # Redis before 8.2 (the test bed's 7.0): Relay clamps
        assert f"limited_by={group}" in line, line
        assert f"effective_cutoff={pending_id}" in line, line
    else:  # XTRIM ... ACKED: the server itself keeps what a group has not acknowledged
        assert "mode=acked" in line, line
    assert re.search(r"removed=[1-9]", line), line
    assert client.xlen(stream) < 201
    assert [i.decode() for i, _ in client.xrange(stream, pending_id, pending_id)] == [pending_id]
    assert ledger.pending() == {pending_id}
