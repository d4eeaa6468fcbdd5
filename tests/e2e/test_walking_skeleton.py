"""One event end to end through the real ``relay start``, a real Redis and real containers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import docker
import pytest
import redis

from relay.adapters.redis.keys import invocation_key
from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import EXAMPLES, copy_function, run_relay, send_event, text, wait_until
from tests.json_schemas import assert_matches_schema

pytestmark = pytest.mark.e2e

EXAMPLE_EVENT = {
    "event_id": "evt_123",
    "event_name": "INSERT",
    "table_name": "users",
    "new_image": {"id": "user_123", "name": "John Doe", "email": "john@example.com"},
}

FAILING_TEMPLATE = """\
runtime: python3.14
events:
  - handler: jobs.fail.handler
    pattern:
      kind: [explode]
"""
FAILING_HANDLER = """\
def handler(event):
    print("about to fail for", event["kind"])
    raise RuntimeError("this handler always fails")
"""


def pending_ids(client: redis.Redis, stream: str, group: str) -> set[str]:
    rows = client.xpending_range(stream, group, min="-", max="+", count=1000)
    return {text(row["message_id"]) for row in rows}


def write_failing_function(functions: Path) -> None:
    fn = functions / "always-fails"
    (fn / "jobs").mkdir(parents=True)
    (fn / "template.yaml").write_text(FAILING_TEMPLATE)
    (fn / "jobs" / "fail.py").write_text(FAILING_HANDLER)


def test_example_event_runs_its_handler_and_is_acknowledged(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
) -> None:
    copy_function(EXAMPLES / "user-events-python", functions_dir)
    worker = relay_worker()
    client = sync_redis
    stream, group = worker_env["REDIS_STREAM"], worker_env["REDIS_GROUP"]

    message_id = send_event(client, stream, EXAMPLE_EVENT)

    worker.wait_for(
        rf'^relay: function "user-events-python" handler "events.created.handler" '
        rf'message "{re.escape(message_id)}": User created: user_123$'
    )
    wait_until(lambda: not pending_ids(client, stream, group), 30, "the message to be acked")
    info = client.xinfo_groups(stream)[0]
    assert text(info["last-delivered-id"]) == message_id
    assert worker.stop() == 0


def test_ledger_retention_sets_how_long_a_finished_message_keeps_its_ledger(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
) -> None:
    copy_function(EXAMPLES / "user-events-python", functions_dir)
    worker = relay_worker(env={"LEDGER_RETENTION": "2h"})
    stream, group = worker_env["REDIS_STREAM"], worker_env["REDIS_GROUP"]

    message_id = send_event(sync_redis, stream, EXAMPLE_EVENT)

    wait_until(lambda: not pending_ids(sync_redis, stream, group), 60, "the message to be acked")
    ttl = sync_redis.ttl(invocation_key(stream, group, message_id))
    assert 3600 < ttl <= 7200  # the default would be 48 h
    assert worker.stop() == 0


def test_failing_handler_leaves_the_message_pending(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
) -> None:
    write_failing_function(functions_dir)
    worker = relay_worker()
    client = sync_redis
    stream, group = worker_env["REDIS_STREAM"], worker_env["REDIS_GROUP"]

    message_id = send_event(client, stream, {"kind": "explode"})

    worker.wait_for(r'handler "jobs.fail.handler" message "[^"]+": about to fail for explode')
    worker.wait_for(rf"msg=invocation_failed .*message_id={re.escape(message_id)}")
    assert message_id in pending_ids(client, stream, group)
    # The failure was recorded and the message still waits for its retry after the stop.
    assert worker.stop() == 0
    assert message_id in pending_ids(client, stream, group)


def test_shutdown_is_clean_and_leaves_no_container(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
) -> None:
    copy_function(EXAMPLES / "user-events-python", functions_dir)
    worker = relay_worker()
    client = sync_redis
    client.xadd(worker_env["REDIS_STREAM"], {"event": json.dumps(EXAMPLE_EVENT)})
    worker.wait_for(r"User created: user_123")
    engine = docker.from_env()
    label = f"relay.hostname={worker_env['RELAY_HOSTNAME']}"
    assert engine.containers.list(filters={"label": label}), "a warm container should be running"

    assert worker.stop() == 0

    worker.wait_for(r"msg=relay_stopped", timeout=5)
    wait_until(
        lambda: not engine.containers.list(all=True, filters={"label": label}),
        30,
        "the worker's containers to be gone",
    )
    assert not (worker.run_dir / "relay.sock").exists()


def test_help_lists_the_whole_command_tree() -> None:
    result = run_relay(["--help"])
    assert result.returncode == 0
    commands = ("start", "health", "stats", "function", "dlq", "secret", "git", "schedule", "trace")
    for command in commands:
        assert re.search(rf"^\W*{command}\b", result.stdout, re.MULTILINE), command
    function_help = run_relay(["function", "--help"]).stdout
    for sub in ("ls", "inspect", "invoke", "validate", "match"):
        assert re.search(rf"^\W*{sub}\b", function_help, re.MULTILINE), sub


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("MAX_CONCURRENCY", "0"),
        ("LOG_LEVEL", "WARNING"),
        ("WARM_CONTAINER_IDLE_TIMEOUT", "300"),
        ("REDIS_URI", ""),
    ],
)
def test_invalid_configuration_stops_start_with_one_line(
    tmp_path: Path, worker_env: dict[str, str], var: str, value: str
) -> None:
    env = {
        **worker_env,
        "RELAY_STATE_DIR": str(tmp_path / "s"),
        "RELAY_RUN_DIR": str(tmp_path / "r"),
        var: value,
    }
    result = run_relay(["start", "--functions", str(tmp_path)], env)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"relay: {var}")
    assert not (tmp_path / "r").exists(), "nothing is touched before configuration is valid"


def test_health_checks_redis_and_docker_for_real(redis_url: str) -> None:
    ok = run_relay(["health"], {"REDIS_URI": redis_url})
    assert ok.returncode == 0, ok.stderr
    ok_json = run_relay(["health", "--json"], {"REDIS_URI": redis_url})
    assert ok_json.returncode == 0, ok_json.stderr
    assert assert_matches_schema(ok_json.stdout)["ok"] is True
    assert ok_json.stderr == ""
    down = run_relay(["health"], {"REDIS_URI": "127.0.0.1:1"})
    assert down.returncode == 1
    assert down.stderr.strip().startswith("relay: redis at 127.0.0.1:1 is unreachable")
    down_json = run_relay(["health", "--json"], {"REDIS_URI": "127.0.0.1:1"})
    assert down_json.returncode == 1
    doc = assert_matches_schema(down_json.stdout)
    assert doc["ok"] is False
    assert doc["problem"].startswith("redis at 127.0.0.1:1 is unreachable")
    no_docker = run_relay(["health"], {"REDIS_URI": redis_url, "DOCKER_HOST": "tcp://127.0.0.1:1"})
    assert no_docker.returncode == 1
    assert no_docker.stderr.strip().startswith("relay: docker is unreachable")
