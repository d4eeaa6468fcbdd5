"""The dry run against the live worker: ``relay function match --from-stream`` over 1,000
entries counts, rule by rule, exactly the invocations a real ``relay start`` then runs on
the same entries, and the malformed entries it dead-letters; and the dry run itself
leaves no consumer group behind."""

from __future__ import annotations

import os
import random
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import RELAY, text, wait_until
from tests.integration.test_match_dry_run_redis import MAX_BYTES, TEMPLATES, entry_fields
from tests.json_schemas import assert_matches_schema

pytestmark = pytest.mark.e2e

RAN = re.compile(r'^relay: function "([^"]+)" handler "([^"]+)" message "[^"]+": ran$')


def write_functions(functions: Path) -> None:
    for name, template in TEMPLATES.items():
        (functions / name).mkdir()
        (functions / name / "template.yaml").write_text(template)
        for handler in re.findall(r"handler: (\S+)\.handler", template):
            module = functions / name / (handler.replace(".", "/") + ".py")
            module.parent.mkdir(parents=True, exist_ok=True)
            module.write_text('def handler(event):\n    print("ran")\n')


def test_the_dry_run_counts_what_the_worker_then_runs(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
) -> None:
    write_functions(functions_dir)
    stream = worker_env["REDIS_STREAM"]
    rng, kinds = random.Random(11), Counter[str]()
    for _ in range(1000):
        sync_redis.xadd(stream, entry_fields(rng, time.time(), kinds))
    env = {**worker_env, "MAX_EVENT_BYTES": str(MAX_BYTES)}

    dry = subprocess.run(
        [RELAY, "function", "match", str(functions_dir), "--from-stream", "--json"],
        env={**_base_env(), **env}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip

    assert dry.returncode == 0, dry.stderr
    document = assert_matches_schema(dry.stdout)
    assert sync_redis.xinfo_groups(stream) == []  # the dry run created no group
    worker = relay_worker(env={
        "MAX_EVENT_BYTES": str(MAX_BYTES),
        "RELAY_TEST_RECOVERY_INTERVAL": "2s",  # events matched while images build
        "RELAY_TEST_RECOVERY_MIN_IDLE": "2s",
    })  # fmt: skip

    def settled() -> bool:
        groups: Any = sync_redis.xinfo_groups(stream)
        return bool(groups) and groups[0]["entries-read"] == 1000 and groups[0]["pending"] == 0

    wait_until(settled, 240, "the worker to settle all 1,000 entries")
    ran = Counter(m.groups() for line in worker.output() if (m := RAN.match(line)))
    dead: Any = sync_redis.xrange(f"relay:{stream}:dlq")
    assert document["malformed"] == kinds["malformed"] > 0
    assert document["malformed"] == sum(1 for _, f in dead if text(f[b"function"]) == "-")
    assert {(r["function"], r["handler"]): r["matched"] for r in document["rules"]} == {
        key: ran[key] for key in ((r["function"], r["handler"]) for r in document["rules"])
    }
    assert sum(ran.values()) > 0
    assert ran["users", "events.recent.handler"] > 0  # the time-based rule, on both sides
    assert worker.stop() == 0


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_"))}
