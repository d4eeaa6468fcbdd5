"""Cron schedules through real ``relay start`` workers, a real Redis and real containers."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from relay.adapters.redis.keys import dlq_key
from relay.domain import schedule
from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import RelayWorker, send_event, text, wait_until

pytestmark = pytest.mark.e2e

TICK = """\
import json


def handler(event):
    print("tick", event["scheduled_at"], json.dumps(sorted(event)))
"""


def write_function(functions: Path, name: str, template: str, modules: dict[str, str]) -> None:
    fn = functions / name
    (fn / "jobs").mkdir(parents=True)
    (fn / "template.yaml").write_text(template)
    for module, source in modules.items():
        (fn / "jobs" / f"{module}.py").write_text(source)


def entries(client: redis.Redis, stream: str) -> list[dict[str, Any]]:
    rows: Any = client.xrange(stream)
    return [json.loads(fields[b"event"]) for _, fields in rows]


def epoch(instant: str) -> int:
    return int(datetime.strptime(instant, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp())


def ticks_run(workers: list[RelayWorker]) -> Counter[str]:
    rx = re.compile(r'handler "jobs\.tick\.handler" message "[0-9-]+": tick (\S+) (.*)$')
    seen: Counter[str] = Counter()
    for worker in workers:
        for line in worker.output():
            m = rx.search(line)
            if m:
                assert m.group(2) == '["scheduled_at", "source"]'  # exactly what it receives
                seen[m.group(1)] += 1
    return seen


# slow by nature: three worker starts, then a full minute of ticks
@pytest.mark.timeout(300)
def test_three_workers_every_second_for_60_ticks_publish_and_run_each_once(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
    unique: str,
) -> None:
    template = (
        'runtime: python3.14\nschedules:\n  - handler: jobs.tick.handler\n    cron: "* * * * * *"\n'
    )
    write_function(functions_dir, "ticker", template, {"tick": TICK})
    workers = [
        relay_worker(name=f"w{i}", env={"RELAY_HOSTNAME": f"host-{unique}-{i}"}) for i in range(3)
    ]
    first = int(time.time()) + 1  # every worker is up for each of the 60 ticks from here
    last = first + 59
    stream = worker_env["REDIS_STREAM"]
    wait_until(
        lambda: any(epoch(e["scheduled_at"]) > last for e in entries(sync_redis, stream)),
        120,
        "every occurrence of the 60 ticks to be published",
    )
    published = [epoch(e["scheduled_at"]) for e in entries(sync_redis, stream)]
    assert len(published) == len(set(published))  # no occurrence twice, ever
    window = [t for t in published if first <= t <= last]
    assert window == list(range(first, last + 1))  # exactly 60 entries, in order
    wanted = {schedule.instant(t) for t in window}
    wait_until(
        lambda: wanted <= set(ticks_run(workers)), 120, "every one of the 60 ticks to run"
    )
    runs = ticks_run(workers)
    assert sum(runs[i] for i in wanted) == 60  # 60 handler runs: each tick exactly once
    # one winner per occurrence across the three workers' publish-if-new
    won: Counter[str] = Counter()
    for worker in workers:
        for line in worker.find(r"msg=occurrence_published .*handler=jobs\.tick\.handler"):
            m = re.search(r"occurrence_id=schedule:ticker:jobs\.tick\.handler:(\S+Z)", line)
            assert m is not None, line
            won[m.group(1)] += 1
    assert all(won[i] == 1 for i in wanted), won


FAILING = """\
def handler(event):
    raise RuntimeError("cleanup failed for " + event["scheduled_at"])
"""
SLOW = """\
import time


def handler(event):
    print("slow start", event["scheduled_at"])
    time.sleep(3)
    print("slow end", event["scheduled_at"])
"""
TEMPLATE = """\
runtime: python3.14
concurrency: 4
schedules:
  - handler: jobs.hourly.handler
    cron: "0 * * * *"
    catchup: 1h
    retries: 0
  - handler: jobs.slow.handler
    cron: "* * * * * *"
    overlap: skip
    timeout: 10s
"""


def test_caught_up_failing_invalid_obsolete_and_skipped_occurrences_end_as_documented(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
) -> None:
    write_function(functions_dir, "jobs", TEMPLATE, {"hourly": FAILING, "slow": SLOW})
    worker = relay_worker()
    stream = worker_env["REDIS_STREAM"]
    # caught up at start: the top of this hour, run once, failed with retries: 0 -> DLQ
    [caught] = worker.wait_for(
        r"msg=occurrence_published.*handler=jobs\.hourly\.handler.*caught_up=True"
    )
    worker.wait_for(r"msg=message_dead_lettered.*handler=jobs\.hourly\.handler")
    found = re.search(r"occurrence_id=schedule:jobs:jobs\.hourly\.handler:(\S+Z)", caught)
    assert found is not None, caught
    hour = epoch(found.group(1))
    expected = schedule.encode(schedule.envelope("jobs", "jobs.hourly.handler", hour)).decode()
    # invalid: an envelope someone wrote by hand; obsolete: a schedule the template lacks
    forged = forged_envelope("jobs", "jobs.hourly.handler", hour + 7)
    invalid_id = send_event(sync_redis, stream, forged)
    gone = schedule.envelope("jobs", "jobs.removed.handler", hour)
    obsolete_id = text(sync_redis.xadd(stream, {"event": schedule.encode(gone)}))
    worker.wait_for(rf"msg=occurrence_obsolete.*message_id={re.escape(obsolete_id)}")
    worker.wait_for(r"msg=occurrence_skipped.*handler=jobs\.slow\.handler")
    wait_until(lambda: int(sync_redis.xlen(dlq_key(stream))) >= 2, 30, "both DLQ entries")
    rows: Any = sync_redis.xrange(dlq_key(stream))
    dlq = [{text(k): text(v) for k, v in f.items()} for _, f in rows]
    failed = [e for e in dlq if e["handler"] == "jobs.hourly.handler"]
    assert len(failed) == 1
    assert failed[0]["event"] == expected  # the envelope, byte for byte
    assert failed[0]["handler_attempts"] == "1"
    [bad] = [e for e in dlq if e["original_id"] == invalid_id]
    assert (bad["function"], bad["handler"]) == ("-", "-")
    assert bad["reason"].startswith("invalid schedule occurrence: ")
    assert not [e for e in dlq if e["original_id"] == obsolete_id]  # obsolete: no DLQ entry
    # overlap: skip never lets two runs of the slow schedule overlap
    marks = worker.find(r'handler "jobs\.slow\.handler" message "[0-9-]+": slow (start|end)')
    running = 0
    for line in marks:
        running += 1 if "slow start" in line else -1
        assert running <= 1, "\n".join(marks)


def forged_envelope(function: str, handler: str, at_s: int) -> dict[str, str]:
    """An envelope whose instant is not a firing of its cron (07 s past the hour)."""
    return {
        "source": "relay.schedule",
        "function": function,
        "handler": handler,
        "scheduled_at": schedule.instant(at_s),
        "occurrence_id": schedule.occurrence_id(function, handler, at_s),
    }
