"""Support for the end-to-end failure-table tests: one function, its marks, the ledger.

Every test writes the same function (same files, so the same image tag: it is
built once and reused). Its handlers print *marks* (``mark <what> <unix time>
<container hostname>``); Relay forwards each line to the worker's output with the
function, handler and message id in front, so the tests count executions and
order them in time from the worker's own output, with no network between the
execution container and the test.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from relay.adapters.redis.keys import dlq_key, invocation_key
from tests.e2e.harness import RelayWorker

FUNCTION = "failure-table"

TEMPLATE = """\
runtime: python3.14
events:
  - handler: ft.marks.slow
    pattern:
      kind: [slow]
    timeout: 4s
  - handler: ft.marks.always_fail
    pattern:
      kind: [fail, pair]
    retries: 2
  - handler: ft.marks.no_retry
    pattern:
      kind: [fail-no-retry]
    retries: 0
  - handler: ft.marks.echo
    pattern:
      kind: [ok, pair]
"""

MARKS = """\
import socket
import time


def _mark(what):
    print(f"mark {what} {time.time():.6f} {socket.gethostname()}", flush=True)


def slow(event):
    _mark("start")
    time.sleep(3)
    failing = time.time() < float(event.get("fail_until", 0))
    _mark("fail" if failing else "end")
    if failing:
        raise RuntimeError("failing until fail_until")


def always_fail(event):
    _mark("run")
    raise RuntimeError("this handler always fails")


def no_retry(event):
    _mark("run")
    raise RuntimeError("this handler fails once, with no retries")


def echo(event):
    _mark("run")
"""

SLOW_TIMEOUT_S = 4.0
CONTAINER_GRACE_S = 2.0  # the bootstrap's own backstop: timeout + grace (RELAY_GRACE_S)

# The recovery loop (XAUTOCLAIM) every second for messages idle a second.
FAST_RECOVERY = {"RELAY_TEST_RECOVERY_INTERVAL": "1s", "RELAY_TEST_RECOVERY_MIN_IDLE": "1s"}


def write_function(functions: Path) -> None:
    fn = functions / FUNCTION
    (fn / "ft").mkdir(parents=True)
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "ft" / "marks.py").write_text(MARKS)


def limit_concurrency(functions: Path, concurrency: int) -> None:
    """Give the function written by :func:`write_function` a ``concurrency``."""
    template = functions / FUNCTION / "template.yaml"
    template.write_text(f"concurrency: {concurrency}\n" + template.read_text())


@dataclass(frozen=True)
class Mark:
    handler: str
    message_id: str
    what: str
    at: float
    container: str


_MARK = re.compile(
    r'^relay: function "(?P<function>[^"]+)" handler "(?P<handler>[^"]+)" '
    r'message "(?P<id>[^"]+)": '
    r"mark (?P<what>\w+) (?P<at>[0-9.]+) (?P<container>\S+)$"
)


def marks(
    worker: RelayWorker,
    message_id: str,
    what: str | None = None,
    *,
    handler: str | None = None,
) -> list[Mark]:
    """The marks the handlers printed for ``message_id`` in ``worker``'s output."""
    found = []
    for line in worker.output():
        m = _MARK.match(line)
        if not m or m["function"] != FUNCTION or m["id"] != message_id:
            continue
        if (what is None or m["what"] == what) and (handler is None or m["handler"] == handler):
            found.append(Mark(m["handler"], m["id"], m["what"], float(m["at"]), m["container"]))
    return found


def mark_pattern(message_id: str, what: str) -> str:
    return rf'message "{re.escape(message_id)}": mark {what} '


class Ledger:
    """Reads (and, for backoffs, rewrites) the test stream's ledger and DLQ."""

    def __init__(self, client: redis.Redis, env: dict[str, str]) -> None:
        # redis-py's reply types are unions of every reply shape: read them as Any.
        self.client: Any = client
        self.stream = env["REDIS_STREAM"]
        self.group = env["REDIS_GROUP"]

    def add(self, event: object) -> str:
        body = event if isinstance(event, bytes | str) else json.dumps(event)
        return self.add_fields({"event": body})

    def add_fields(self, fields: dict[str, Any]) -> str:
        return str(self.client.xadd(self.stream, fields).decode())

    def key(self, message_id: str) -> str:
        return invocation_key(self.stream, self.group, message_id)

    def marker(self, message_id: str, handler: str) -> str | None:
        raw = self.client.hget(self.key(message_id), f"{FUNCTION}/{handler}")
        return raw.decode() if isinstance(raw, bytes) else None

    def pending(self) -> set[str]:
        rows = self.client.xpending_range(self.stream, self.group, min="-", max="+", count=1000)
        return {row["message_id"].decode() for row in rows}

    def dlq(self) -> list[dict[str, str]]:
        entries = self.client.xrange(dlq_key(self.stream))
        return [
            {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}
            for _id, fields in entries
        ]

    def dlq_of(self, message_id: str) -> list[dict[str, str]]:
        return [e for e in self.dlq() if e["original_id"] == message_id]

    def expire_backoff(self, message_id: str, handler: str, attempt: int) -> bool:
        """Move the retry deadline of ``attempt`` to the past (as the original project's
        tests do, so a test need not wait the real 1m/2m backoff); False until the
        marker is ``next_attempt_at:<deadline>#<attempt>``. Nothing else writes a
        marker while its backoff protects it, so the read-then-write is safe."""
        current = self.marker(message_id, handler)
        if current is None or not current.startswith("next_attempt_at:"):
            return False
        if not current.endswith(f"#{attempt}"):
            return False
        field = f"{FUNCTION}/{handler}"
        self.client.hset(self.key(message_id), field, f"next_attempt_at:1#{attempt}")
        return True


def running_deadline_s(marker: str | None) -> tuple[float, int]:
    """(deadline in unix seconds, attempt) of a ``running:<ms>#<n>#<token>`` marker."""
    assert marker is not None
    assert marker.startswith("running:"), marker
    deadline, attempt, _token = marker.removeprefix("running:").split("#")
    return int(deadline) / 1000, int(attempt)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def metric(port: int, name: str) -> float | None:
    """The value of an unlabelled series on ``/metrics``; None until it answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None
