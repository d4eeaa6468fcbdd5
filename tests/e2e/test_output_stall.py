"""``relay start`` whose stdout nobody reads for a while (a stalled log shipper):
the worker keeps handling events, drops lines with a counted marker instead of
blocking, and says so once its reader is back."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
import redis

from tests.e2e.harness import RelayWorker, send_event, text, wait_until

pytestmark = pytest.mark.e2e

TEMPLATE = """\
runtime: python3.14
events:
  - handler: chatty.shout
    pattern:
      kind: [shout]
"""

# about 2 MiB of output per event, in 1 KiB lines
CHATTY = """\
import sys


def shout(event):
    line = "s" * 1023 + "\\n"
    for _ in range(2048):
        sys.stdout.write(line)
    print("shouted", event["n"])
"""

EVENTS = 6  # 12 MiB in all: far more than the pipe and Relay's queue hold


class StalledReader(RelayWorker):
    """A worker whose output pump stops reading while ``reading`` is clear."""

    def __init__(self, root: Path, functions: Path, env: dict[str, str]) -> None:
        super().__init__(root, functions, env)
        self.reading = threading.Event()
        self.reading.set()

    def _pump(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.reading.wait()
            with self._lock:
                self.lines.append(line.rstrip("\n"))


@pytest.fixture
def stalled_worker(
    tmp_path: Path, functions_dir: Path, worker_env: dict[str, str]
) -> Iterator[StalledReader]:
    fn = functions_dir / "chatty"
    fn.mkdir()
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "chatty.py").write_text(CHATTY)
    root = tmp_path / "worker"
    root.mkdir()
    worker = StalledReader(root, functions_dir, {**worker_env, "LOG_LEVEL": "INFO"})
    try:
        yield worker
    finally:
        worker.reading.set()
        try:
            worker.stop(timeout=30)
        except Exception:  # a stuck worker must not leak: kill it
            worker.kill()
        client = docker.from_env()
        try:
            label = f"relay.hostname={worker_env['RELAY_HOSTNAME']}"
            for container in client.containers.list(
                all=True, sparse=True, filters={"label": label}
            ):
                with contextlib.suppress(docker.errors.NotFound):  # auto-removed meanwhile
                    container.remove(force=True)
        finally:
            client.close()


def test_a_stdout_nobody_reads_never_stalls_the_worker(
    stalled_worker: StalledReader, sync_redis: redis.Redis, worker_env: dict[str, str]
) -> None:
    worker = stalled_worker
    worker.start()
    stream, group = worker_env["REDIS_STREAM"], worker_env["REDIS_GROUP"]
    worker.reading.clear()  # the reader stalls: the pipe fills, then Relay's queue
    last = ""
    for n in range(EVENTS):
        last = send_event(sync_redis, stream, {"kind": "shout", "n": n})

    def all_handled() -> bool:
        (info,) = [g for g in sync_redis.xinfo_groups(stream) if text(g["name"]) == group]
        return text(info["last-delivered-id"]) == last and int(info["pending"]) == 0

    # every event handled and acknowledged while nobody read a byte of the output
    wait_until(all_handled, timeout=120, what="every event acknowledged")
    worker.reading.set()  # the reader is back
    marker = worker.wait_for(r"^relay: \d+ lines dropped: std(out|err) is not keeping up$")
    assert int(marker[0].split()[1]) > 0
    assert worker.stop() == 0
    assert worker.find("msg=relay_stopped")  # the queue was written out at shutdown
