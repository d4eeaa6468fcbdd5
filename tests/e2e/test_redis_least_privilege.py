"""The least-privilege Redis user of docs/deployment.md, for real: a worker whose
REDIS_URI names a user made from exactly the documented ``ACL SETUSER`` line runs
events, dead-letters and schedules, the admin commands read what it wrote,
and Redis's ``ACL LOG`` records no command it refused. Its schedule's occurrences
exercise the ``GET`` of their dedup key (``+get``: a delivered occurrence runs only
if the key names its entry, issue 35.12); a delayed publish with an idempotency
key exercises the sorted set and the counter of delayed events (issue 33)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import REPO, run_relay, send_event, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.docker, pytest.mark.timeout(240)]

HANDLERS = """\
def ok(event):
    print("handled", event["n"])


def fails(event):
    raise RuntimeError("always fails")


def tick(event):
    print("tick", event["scheduled_at"])
"""
TEMPLATE = """\
runtime: python3.14
events:
  - handler: jobs.handlers.ok
    pattern: {kind: [ok]}
  - handler: jobs.handlers.fails
    pattern: {kind: [fails]}
    retries: 0
schedules:
  - handler: jobs.handlers.tick
    cron: "* * * * * *"
"""


def documented_acl() -> list[str]:
    """The ``ACL SETUSER ...`` command of docs/deployment.md, as its words."""
    text = (REPO / "docs" / "deployment.md").read_text()
    (block,) = re.findall(r"```text\n\s*(ACL SETUSER .*?)```", text, re.S)
    return str(block).split()


@pytest.fixture
def acl_uri(
    redis_url: str, sync_redis: redis.Redis, unique: str, worker_env: dict[str, str]
) -> Iterator[str]:
    """A user made from the documented line, for this test's stream; removed afterwards."""
    words = documented_acl()
    assert words[:3] == ["ACL", "SETUSER", "relay"], words[:3]
    password = f"pw-{unique}"
    stream = worker_env["REDIS_STREAM"]
    rules = [
        f">{password}" if w == ">CHANGE-ME" else f"~{stream}" if w == "~events" else w
        for w in words[3:]
    ]
    assert f"~{stream}" in rules  # the doc still names the stream the way this assumes
    # the documented words as they are: redis-py's acl_setuser would re-spell them
    sync_redis.execute_command("ACL", "SETUSER", unique, *rules)  # type: ignore[no-untyped-call]
    sync_redis.acl_log_reset()
    try:
        yield redis_url.replace("redis://", f"redis://{unique}:{password}@")
    finally:
        sync_redis.acl_deluser(unique)


def _refused(client: redis.Redis, user: str) -> list[Any]:
    # a 7.2+ server also logs the client library's CLIENT SETINFO, which the
    # documentation says may be refused (the library carries on without it)
    return [
        entry
        for entry in client.acl_log()
        if str(entry.get("username")) == user and entry.get("object") != "client|setinfo"
    ]


def test_a_worker_as_the_documented_least_privilege_user_is_never_refused(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
    acl_uri: str,
    unique: str,
) -> None:
    fn = functions_dir / "acl-check"
    (fn / "jobs").mkdir(parents=True)
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "jobs" / "handlers.py").write_text(HANDLERS)
    env = {"REDIS_URI": acl_uri, "REDIS_STREAM_RETENTION": "1h"}
    worker = relay_worker(env=env)
    stream = worker_env["REDIS_STREAM"]
    ok_id = send_event(sync_redis, stream, {"kind": "ok", "n": 1})
    failed_id = send_event(sync_redis, stream, {"kind": "fails"})
    worker.wait_for(rf'message "{ok_id}": handled 1')
    worker.wait_for(r'handler "jobs\.handlers\.tick" message "[0-9-]+": tick ')
    admin = {**worker.admin_env, "REDIS_URI": acl_uri}

    def dead_lettered() -> bool:
        listed = run_relay(["dlq", "ls"], admin)
        return listed.returncode == 0 and failed_id in listed.stdout

    wait_until(dead_lettered, 90, "the failing event in relay dlq ls")
    # A delayed, keyed publish as that user: publish.lua, then the worker's mover.
    once = ["publish", "--event", '{"kind": "ok", "n": 2}', "--delay", "1s", "--id", unique]
    for _ in range(2):
        published = run_relay(once, admin)
        assert published.returncode == 0, published.stderr
    worker.wait_for(r'message "[0-9-]+": handled 2')
    for args in (["trace", ok_id], ["schedule", "ls"], ["health"]):
        done = run_relay(args, admin)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        assert not done.stderr.strip(), (args, done.stderr)  # schedule ls: nothing "unknown"
    assert _refused(sync_redis, unique) == []
    refusals = (r"NOPERM|can't run this command|stale_consumers_not_removed|publish_failed"
                r"|delayed_move_failed|backlog_sample_failed")
    assert not worker.find(refusals)
