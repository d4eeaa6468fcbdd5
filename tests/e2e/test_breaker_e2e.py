"""The circuit breaker against a real downstream: a real ``relay start`` worker, real
Redis, real execution containers, and a "downstream" container on a Docker network
the execution containers join (``NETWORKS``).

The downstream container runs from the start (so its name resolves) but listens on
nothing until the test starts its HTTP server: until then every call is refused at
once, like a service that is down.
"""

from __future__ import annotations

import json
import re
import sqlite3
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from relay.adapters.redis.keys import dlq_key, invocation_key
from tests.e2e.conftest import WorkerFactory
from tests.e2e.failure_support import FAST_RECOVERY, free_port
from tests.e2e.harness import (
    RelayWorker,
    run_relay,
    run_relay_in_process,
    send_event,
    text,
    wait_until,
)
from tests.testbed import DockerCleanup

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

FUNCTION = "pay"
FIELD = "pay/pay.charge"
PYTHON_IMAGE = "python:3.14-slim"  # the stand-in Relay's python3.14 runtime builds on
MESSAGES = 8

TEMPLATE = """\
runtime: python3.14
breaker:
  failures: 2
  window: 1m
  cooldown: 3s
  max_cooldown: 6s
events:
  - handler: pay.charge
    pattern:
      kind: [order]
    timeout: 10s
    retries: 20
"""

HANDLER = """\
import urllib.request


def charge(event):
    with urllib.request.urlopen("http://downstream:8000/", timeout=3) as reply:
        reply.read()
    print(f"charged {event['n']}", flush=True)
"""


@dataclass
class Downstream:
    network: str
    container: Any

    def come_back(self) -> None:
        self.container.exec_run(
            ["python3", "-m", "http.server", "8000", "--bind", "0.0.0.0"], detach=True
        )


@pytest.fixture
def downstream(docker_cleanup: DockerCleanup, unique: str) -> Downstream:
    """A network and a downstream container on it, down (listening on nothing)."""
    client = docker_cleanup.client
    network = docker_cleanup.network(f"relay-bk-{unique}")
    client.networks.create(network, labels=docker_cleanup.labels)
    container = client.containers.run(
        PYTHON_IMAGE,
        ["python3", "-c", "import time; time.sleep(3600)"],
        name=f"downstream-{unique}",
        network=network,
        labels=docker_cleanup.labels,
        detach=True,
    )
    docker_cleanup.container(container.id)
    # the handler calls it by a name of its own: "downstream"
    client.networks.get(network).disconnect(container)
    client.networks.get(network).connect(container, aliases=["downstream"])
    return Downstream(network, container)


def write_function(functions: Path) -> None:
    fn = functions / FUNCTION
    fn.mkdir(parents=True)
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "pay.py").write_text(HANDLER)


def charged(worker: RelayWorker) -> set[str]:
    rx = re.compile(rf'^relay: function "{FUNCTION}" handler "pay.charge" '
                    r'message "(?P<id>[^"]+)": charged \d+$')
    return {m["id"] for line in worker.output() if (m := rx.match(line))}


class RedisView:
    """The test's stream, ledger and DLQ on the session Redis."""

    def __init__(self, client: Any, env: dict[str, str]) -> None:
        self.client, self.stream, self.group = client, env["REDIS_STREAM"], env["REDIS_GROUP"]
        self.env: dict[str, str] = {}

    def send(self, n: int) -> str:
        return send_event(self.client, self.stream, {"kind": "order", "n": n})

    def pending(self) -> set[str]:
        rows = self.client.xpending_range(self.stream, self.group, min="-", max="+", count=1000)
        return {text(row["message_id"]) for row in rows}

    def charged(self, ids: set[str]) -> int:
        """How many of ``ids`` have an attempt recorded (a marker in their ledger hash)."""
        return sum(
            self.client.hget(invocation_key(self.stream, self.group, i), FIELD) is not None
            for i in ids
        )

    def dead_letters(self) -> int:
        return int(self.client.xlen(dlq_key(self.stream)))

    def end_backoffs(self, ids: set[str]) -> None:
        """Move every retry deadline of ``ids`` to the past, as the failure-table tests
        do, so the test need not wait the real 1m backoff of the attempts that failed
        (held messages have none: they were never charged)."""
        for message_id in ids:
            key = invocation_key(self.stream, self.group, message_id)
            marker = self.client.hget(key, FIELD)
            if marker is not None and text(marker).startswith("next_attempt_at:"):
                attempt = text(marker).rpartition("#")[2]
                self.client.hset(key, FIELD, f"next_attempt_at:1#{attempt}")


class SqliteView:
    """The same on the embedded broker's file (read only: backoffs run their course)."""

    def __init__(self, path: Path, stream: str) -> None:
        self.path = path
        self.env = {"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(path)}
        self.stream = stream

    def send(self, n: int) -> str:
        # In-process, as quick as the Redis side's XADD: a `relay publish` process per
        # event took seconds each on a busy machine, so every late event arrived after
        # the cooldown, became a probe and was charged (the test's `charged < 8` failed).
        event = json.dumps({"kind": "order", "n": n})
        env = {**self.env, "REDIS_STREAM": self.stream}
        done = run_relay_in_process(["publish", "--event", event], env)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def _rows(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def pending(self) -> set[str]:
        return {str(seq) for (seq,) in self._rows("SELECT seq FROM jobs WHERE state != 'acked'")}

    def charged(self, ids: set[str]) -> int:
        return int(self._rows("SELECT count(*) FROM ledger WHERE field = ?", FIELD)[0][0])

    def dead_letters(self) -> int:
        return int(self._rows("SELECT count(*) FROM dlq")[0][0])

    def end_backoffs(self, ids: set[str]) -> None:
        return None


BrokerView = RedisView | SqliteView


@pytest.fixture(params=["redis", "sqlite"])
def broker(request: pytest.FixtureRequest, sync_redis: redis.Redis, worker_env: dict[str, str],
           tmp_path: Path) -> BrokerView:
    if request.param == "redis":
        return RedisView(sync_redis, worker_env)
    return SqliteView(tmp_path / "broker.sqlite3", worker_env["REDIS_STREAM"])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def test_a_dead_downstream_opens_the_breaker_without_dlq_entries_and_every_held_message_completes(
    downstream: Downstream,
    broker: BrokerView,
    relay_worker: WorkerFactory,
    functions_dir: Path,
) -> None:
    """Rows 97-99 and 101, on each broker: the breaker opens after 2 failures, holds
    the rest (no attempt, no DLQ entry), probes after its cooldown, closes once the
    downstream answers; then every message completes: lost = 0."""
    write_function(functions_dir)
    port = free_port()
    worker = relay_worker(env={
        **FAST_RECOVERY, **broker.env,
        "NETWORKS": downstream.network, "METRICS_ADDR": f"127.0.0.1:{port}",
    })
    ids = {broker.send(n) for n in range(MESSAGES)}

    worker.wait_for(r"msg=breaker_opened .*cause=failures", timeout=180)
    worker.wait_for(r"msg=invocation_deferred .*reason=breaker_open", timeout=60)
    admin = {**worker.admin_env, **broker.env}
    inspect = run_relay(["function", "inspect", FUNCTION], admin)
    assert inspect.returncode == 0, inspect.stderr
    [line] = [x for x in inspect.stdout.splitlines() if x.startswith("Breaker:")]
    assert re.match(r"Breaker: +(open \(|half-open)", line), line
    wait_until(lambda: re.search(r'function_breaker_state\{function="pay"\} [12]', scrape(port)),
               30, "the breaker gauge at open or half-open")
    # held messages are not charged: only the openers and any failed probe have an attempt
    assert broker.charged(ids) < MESSAGES
    assert broker.dead_letters() == 0

    downstream.come_back()
    worker.wait_for(r"msg=breaker_closed .*cause=probe_succeeded", timeout=120)

    def all_done() -> bool:
        left = broker.pending()
        broker.end_backoffs(left)
        return not left

    # on the embedded broker the openers wait out their real 1m retry backoff
    wait_until(all_done, 240, "every held message to complete")
    assert charged(worker) == ids  # lost = 0
    assert broker.dead_letters() == 0
    assert worker.find(r"msg=invocation_exhausted") == []
    metrics = scrape(port)
    assert 'function_breaker_state{function="pay"} 0.0' in metrics
    assert re.search(
        r'function_breaker_transitions_total\{function="pay",state="closed"\} [1-9]', metrics
    )


def test_an_operator_forces_the_breaker_open_and_closed_on_the_live_worker(
    downstream: Downstream,
    relay_worker: WorkerFactory,
    functions_dir: Path,
    sync_redis: redis.Redis,
    worker_env: dict[str, str],
) -> None:
    """Row 100: ``relay function breaker open`` holds every invocation (no attempt
    charged, no probe) until ``relay function breaker close``."""
    write_function(functions_dir)
    downstream.come_back()
    worker = relay_worker(env={**FAST_RECOVERY, "NETWORKS": downstream.network})
    client: Any = sync_redis
    stream, group = worker_env["REDIS_STREAM"], worker_env["REDIS_GROUP"]
    view = RedisView(client, worker_env)

    opened = run_relay(["function", "breaker", "open", FUNCTION], worker.admin_env)
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout == (
        f"{FUNCTION}: breaker open (forced: held until `relay function breaker close "
        f"{FUNCTION}`)\n"
    )
    worker.wait_for(r"msg=breaker_opened .*cause=forced")
    message_id = send_event(client, stream, {"kind": "order", "n": 1})
    worker.wait_for(r"msg=invocation_deferred .*reason=breaker_open", count=2, timeout=60)
    assert charged(worker) == set()
    assert client.hget(invocation_key(stream, group, message_id), FIELD) is None
    inspect = run_relay(["function", "inspect", FUNCTION], worker.admin_env)
    assert "Breaker:         open (forced: held until" in inspect.stdout

    closed = run_relay(["function", "breaker", "close", FUNCTION], worker.admin_env)
    assert closed.returncode == 0, closed.stderr
    assert closed.stdout == f"{FUNCTION}: breaker closed\n"
    wait_until(lambda: charged(worker) == {message_id}, 60, "the held message to run")
    wait_until(lambda: not view.pending(), 60, "the message to be acked")

    unknown = run_relay(["function", "breaker", "open", "nope"], worker.admin_env)
    assert unknown.returncode == 1
    assert unknown.stderr == 'relay: function "nope" not found on the worker\n'
