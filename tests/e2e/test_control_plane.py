"""The control plane end to end: the process lock, ``function invoke``, ``/metrics``,
``relay stats`` (and its reset) and ``relay trace`` against a real worker."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import (
    EXAMPLES,
    RelayWorker,
    copy_function,
    run_relay,
    run_relay_in_process,
    wait_until,
)
from tests.e2e.test_walking_skeleton import EXAMPLE_EVENT, pending_ids, write_failing_function
from tests.json_schemas import assert_matches_schema

pytestmark = pytest.mark.e2e

FUNCTION = "user-events-python"
UPDATE_EVENT = {**EXAMPLE_EVENT, "event_name": "MODIFY"}
UNMATCHED_EVENT = {"event_name": "INSERT", "table_name": "orders"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def try_scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    """``scrape``, or ``None`` while the worker's metrics server is not answering yet."""
    try:
        return scrape(port)
    except OSError:  # URLError included: not bound yet (a bind failure is retried)
        return None


def sample(
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def acked(client: redis.Redis, stream: str, group: str, message_id: object) -> None:
    """Wait until the group has delivered ``message_id`` and nothing is pending."""
    wanted = message_id.decode() if isinstance(message_id, bytes) else str(message_id)

    def done() -> bool:
        info = client.xinfo_groups(stream)[0]
        return info["last-delivered-id"].decode() == wanted and not pending_ids(
            client, stream, group
        )

    wait_until(done, 30, f"message {wanted} to be acknowledged")


def stats_value(worker: RelayWorker, label: str) -> str:
    # in-process: polled in loops, where an interpreter start per poll adds up
    result = run_relay_in_process(["stats"], worker.admin_env)
    assert result.returncode == 0, result.stderr
    found = re.search(rf"^{re.escape(label)}:\s+(.*)$", result.stdout, re.MULTILINE)
    assert found, result.stdout
    return found.group(1)


def test_a_second_start_fails_on_the_lock(relay_worker: WorkerFactory, functions_dir: Path) -> None:
    worker = relay_worker()
    second = run_relay(["start", "--functions", str(functions_dir)], worker.env)
    assert second.returncode == 1
    lock = worker.run_dir / "relay.lock"
    # logs go to stderr too; the user-facing line is the last one
    assert second.stderr.strip().splitlines()[-1] == f"relay: another relay worker holds {lock}"
    # the live worker's socket was not disturbed
    health = run_relay(["stats", "reset"], worker.admin_env)
    assert health.returncode == 0, health.stderr
    assert worker.stop() == 0


def test_invoke_runs_on_the_worker_and_leaves_delivery_untouched(
    relay_worker: WorkerFactory, functions_dir: Path, worker_env: dict[str, str], redis_url: str
) -> None:
    copy_function(EXAMPLES / FUNCTION, functions_dir)
    port = free_port()
    worker = relay_worker(env={"METRICS_ADDR": f"127.0.0.1:{port}"})
    stream = worker_env["REDIS_STREAM"]

    result = run_relay(
        ["function", "invoke", FUNCTION, "--event", json.dumps(EXAMPLE_EVENT)], worker.admin_env
    )
    assert result.returncode == 0, result.stderr
    # each handler's run as `relay function run` shows it, then the summary
    lines = result.stdout.splitlines()
    assert lines[0].startswith("handler: ")
    assert lines[1].startswith(f"image: relay-fn-{FUNCTION}:")
    assert any("User created: user_123" in line for line in lines), result.stdout
    assert any(line.startswith("returned: ") for line in lines)
    assert lines[-1] == "Invoked 1 handler"
    worker.wait_for(r"User created: user_123")  # still forwarded by the worker too
    none = run_relay(
        ["function", "invoke", FUNCTION], worker.admin_env, stdin=json.dumps(UNMATCHED_EVENT)
    )
    assert none.stdout == "No matching handlers\n", none.stderr
    unknown = run_relay(["function", "invoke", "nope", "--event", "{}"], worker.admin_env)
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == 'relay: function "nope" not found'

    client = redis.Redis.from_url(redis_url)
    assert client.xlen(stream) == 0
    assert not client.exists(f"relay:{stream}:dlq")
    metrics = scrape(port)
    assert sample(metrics, "events_received_total") == 0
    assert sample(metrics, "handler_success_total") == 0
    assert (
        sample(
            metrics,
            "handler_invocations_total",
            outcome="success",
            function=FUNCTION,
            handler="events.created.handler",
        )
        == 1
    )
    assert worker.stop() == 0
    assert stats_value(worker, "Events received") == "0"
    assert stats_value(worker, "Handler successes") == "0"


def test_invoke_without_a_worker_fails(tmp_path: Path) -> None:
    env = {"RELAY_RUN_DIR": str(tmp_path / "run")}
    result = run_relay(["function", "invoke", FUNCTION, "--event", "{}"], env)
    assert result.returncode == 1
    assert "no relay worker is running" in result.stderr


def test_stats_metrics_and_pool_counters_through_a_run_and_a_reset(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    redis_url: str,
    tmp_path: Path,
) -> None:
    copy_function(EXAMPLES / FUNCTION, functions_dir)
    # The installed command once; the admin commands against the live worker below run
    # in-process (ten interpreter starts made this test the slowest of its tier).
    fresh = run_relay(["stats"], {"RELAY_STATE_DIR": str(tmp_path / "fresh")})
    assert fresh.returncode == 0
    assert "Events received:     0\n" in fresh.stdout
    assert fresh.stdout.endswith("Updated:             never\n")

    port = free_port()
    worker = relay_worker(env={"METRICS_ADDR": f"127.0.0.1:{port}"})
    client = redis.Redis.from_url(redis_url)
    stream, group = worker_env["REDIS_STREAM"], worker_env["REDIS_GROUP"]
    for event in (EXAMPLE_EVENT, UPDATE_EVENT, UNMATCHED_EVENT):  # one at a time: cold, warm
        acked(client, stream, group, client.xadd(stream, {"event": json.dumps(event)}))

    metrics = wait_until(lambda: try_scrape(port), 30, "the metrics server to answer")
    assert isinstance(metrics, dict)
    received = sample(metrics, "events_received_total")
    assert received == 3
    assert received == sample(metrics, "events_matched_total") + sample(
        metrics, "events_unmatched_total"
    )
    assert (
        sample(metrics, "runtime_container_acquires_total", function=FUNCTION, outcome="cold") == 1
    )
    assert (
        sample(metrics, "runtime_container_acquires_total", function=FUNCTION, outcome="warm") == 1
    )

    wait_until(lambda: stats_value(worker, "Events received") == "3", 30, "a stats flush")
    assert stats_value(worker, "Events matched") == "2"
    assert stats_value(worker, "Events unmatched") == "1"
    assert stats_value(worker, "Handler successes") == "2"
    assert stats_value(worker, "Updated") != "never"
    inspect = run_relay_in_process(["function", "inspect", FUNCTION], worker.admin_env)
    assert re.search(r"^  Cold starts:\s+1$", inspect.stdout, re.MULTILINE), inspect.stdout
    assert re.search(r"^  Warm acquires:\s+1$", inspect.stdout, re.MULTILINE), inspect.stdout
    assert re.search(r"^  Events matched:\s+2$", inspect.stdout, re.MULTILINE), inspect.stdout
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(\d+[smh] ago\)$"
    for label in ("Last matched:", "Last success:"):
        assert re.search(rf"^  {label}\s+{stamp}", inspect.stdout, re.MULTILINE), inspect.stdout
    assert "Last failure:" not in inspect.stdout
    # the same facts as documents, from the live worker (its pool) and the flushed stats
    shown = assert_matches_schema(
        run_relay_in_process(["function", "inspect", FUNCTION, "--json"], worker.admin_env).stdout
    )
    assert shown["pool"]["live"] is not None
    assert shown["pool"]["live"]["capacity"] >= 1
    assert (shown["pool"]["cold_starts"], shown["pool"]["warm_acquires"]) == (1, 1)
    assert shown["stats"]["events_matched"] == 2
    assert shown["stats"]["last_success_at"] is not None
    assert shown["stats"]["last_failure_at"] is None
    totals = assert_matches_schema(
        run_relay_in_process(["stats", "--json"], worker.admin_env).stdout
    )
    assert (totals["events_received"], totals["events_unmatched"]) == (3, 1)
    assert totals["updated_at"] is not None
    listed = assert_matches_schema(
        run_relay_in_process(["function", "ls", "--json"], worker.admin_env).stdout
    )
    assert [(f["name"], f["status"]) for f in listed["functions"]] == [(FUNCTION, "ready")]

    reset = run_relay_in_process(["stats", "reset"], worker.admin_env)
    assert reset.returncode == 0, reset.stderr
    assert stats_value(worker, "Events received") == "0"
    after_reset = run_relay_in_process(["function", "inspect", FUNCTION], worker.admin_env)
    assert "Last success:" not in after_reset.stdout, after_reset.stdout
    client.xadd(stream, {"event": json.dumps(EXAMPLE_EVENT)})
    wait_until(
        lambda: stats_value(worker, "Events received") == "1",
        30,
        "the stats to grow again from zero",
    )
    assert stats_value(worker, "Handler successes") == "1"
    # Prometheus stays monotonic through a reset
    assert sample(scrape(port), "events_received_total") == 4
    assert worker.stop() == 0


def test_trace_shows_a_failed_attempt_and_its_next_attempt_time(
    relay_worker: WorkerFactory, functions_dir: Path, worker_env: dict[str, str], redis_url: str
) -> None:
    write_failing_function(functions_dir)
    worker = relay_worker()
    client = redis.Redis.from_url(redis_url)
    message_id = client.xadd(
        worker_env["REDIS_STREAM"], {"event": json.dumps({"kind": "explode"})}
    ).decode()  # type: ignore[union-attr]  # bytes: the client does not decode
    worker.wait_for(rf"msg=invocation_failed .*message_id={re.escape(message_id)}")

    result = run_relay(["trace", message_id], worker.admin_env)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert f"Pending:      yes, with consumer {worker_env['RELAY_HOSTNAME']}" in text
    assert "Classified:   matched: always-fails" in text
    assert re.search(
        r"always-fails/jobs\.fail\.handler\s+attempt 1 failed; next attempt at "
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(in (5\d|60)s|1m\)",
        text,
    ), text
    assert "Verdict:      waiting out a retry backoff" in text
    assert worker.stop() == 0


def test_a_redelivered_event_is_not_classified_again(
    relay_worker: WorkerFactory, functions_dir: Path, worker_env: dict[str, str], redis_url: str
) -> None:
    write_failing_function(functions_dir)
    first = relay_worker(name="a")
    client = redis.Redis.from_url(redis_url)
    stream, group = worker_env["REDIS_STREAM"], worker_env["REDIS_GROUP"]
    failing = client.xadd(stream, {"event": json.dumps({"kind": "explode"})}).decode()  # type: ignore[union-attr]
    first.wait_for(rf"msg=invocation_failed .*message_id={re.escape(failing)}")
    assert first.stop() == 0
    # Make the entry look abandoned long ago, so the next worker's recovery takes it now.
    client.xclaim(stream, group, "gone-worker", 0, [failing], idle=600_000)

    port = free_port()
    host = f"{worker_env['RELAY_HOSTNAME']}-b"
    second = relay_worker(
        name="b", env={"METRICS_ADDR": f"127.0.0.1:{port}", "RELAY_HOSTNAME": host}
    )
    client.xadd(stream, {"event": json.dumps(UNMATCHED_EVENT)})

    def settled() -> bool:
        rows = client.xpending_range(stream, group, min=failing, max=failing, count=1)
        redelivered = bool(rows) and rows[0]["consumer"] == host.encode()
        metrics = try_scrape(port)
        return (
            metrics is not None
            and redelivered
            and sample(metrics, "buffered_events") == 0
            and sample(metrics, "events_received_total") == 1
        )

    wait_until(settled, 60, "the redelivery and the new event to be handled")
    metrics = scrape(port)
    assert sample(metrics, "events_unmatched_total") == 1
    assert sample(metrics, "events_matched_total") == 0  # the redelivery was not counted again
    assert sample(metrics, "events_received_total") == sample(
        metrics, "events_matched_total"
    ) + sample(metrics, "events_unmatched_total")
    assert second.stop() == 0
