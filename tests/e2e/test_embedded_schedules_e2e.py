"""Cron schedules on the embedded broker: two real ``relay start`` workers share one
broker file (no Redis anywhere) and real containers run the ticks."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from relay.adapters.sqlite.broker import jobs
from relay.domain import schedule
from tests.e2e.embedded_support import EmbeddedWorkers, admin_env, broker_rows
from tests.e2e.harness import run_relay, wait_until
from tests.e2e.test_schedules_e2e import TICK, epoch, ticks_run, write_function
from tests.json_schemas import assert_matches_schema

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

TICKS = 20


def published(path: Path) -> list[int]:
    """The scheduled instant of every occurrence job in the file, in job order."""
    rows = broker_rows(path, "SELECT payload FROM jobs ORDER BY seq")
    return [epoch(json.loads(p)["scheduled_at"]) for (p,) in rows]


@pytest.mark.timeout(300)
def test_two_workers_sharing_the_broker_file_publish_and_run_each_occurrence_once(
    embedded_worker: EmbeddedWorkers, functions_dir: Path, broker_file: Path
) -> None:
    """Row 132: an every-second schedule, two workers on one broker file: each of
    20 consecutive occurrences is one job (the file's publish-if-new) and runs
    once, and exactly one of the two workers logs having published it."""
    template = (
        'runtime: python3.14\nschedules:\n  - handler: jobs.tick.handler\n    cron: "* * * * * *"\n'
    )
    write_function(functions_dir, "ticker", template, {"tick": TICK})
    workers = [embedded_worker(name=f"w{i}") for i in range(2)]
    for worker in workers:
        worker.wait_for(r"msg=function_prepared function=ticker ", timeout=180)
        assert not worker.find("schedules_not_published")
    first = int(time.time()) + 1  # both workers serve the function for each tick from here
    last = first + TICKS - 1
    wait_until(
        lambda: any(t > last for t in published(broker_file)),
        120,
        f"every occurrence of the {TICKS} ticks to be published",
    )
    instants = published(broker_file)
    assert len(instants) == len(set(instants))  # no occurrence twice, ever
    assert [t for t in instants if first <= t <= last] == list(range(first, last + 1))
    wanted = {schedule.instant(t) for t in range(first, last + 1)}
    wait_until(
        lambda: wanted <= set(ticks_run(workers)), 120, f"every one of the {TICKS} ticks to run"
    )
    runs = ticks_run(workers)
    assert sum(runs[i] for i in wanted) == TICKS  # each tick ran exactly once
    won: Counter[str] = Counter()
    for worker in workers:
        for line in worker.find(r"msg=occurrence_published .*handler=jobs\.tick\.handler"):
            m = re.search(r"occurrence_id=schedule:ticker:jobs\.tick\.handler:(\S+Z)", line)
            assert m is not None, line
            won[m.group(1)] += 1
    assert all(won[i] == 1 for i in wanted), won
    # the admin commands read the occurrence history from the file, no Redis
    env = admin_env(workers[0])
    listed = run_relay(["schedule", "ls"], env)
    assert listed.returncode == 0, listed.stderr
    [row] = [line for line in listed.stdout.splitlines() if line.startswith("ticker/")]
    published_at = re.findall(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row)[0]  # LAST PUBLISHED
    assert published_at >= schedule.instant(last)
    as_json = run_relay(["schedule", "ls", "--json"], env)
    assert as_json.returncode == 0, as_json.stderr
    doc = assert_matches_schema(as_json.stdout)
    assert doc["last_published_error"] is None
    [ticker] = [s for s in doc["schedules"] if s["function"] == "ticker"]
    assert ticker["last_published"] >= schedule.instant(last)
    [(seq, created_ms)] = broker_rows(
        broker_file,
        "SELECT seq, created_ms FROM jobs WHERE json_extract(payload, '$.scheduled_at') = ?",
        schedule.instant(first),
    )
    traced = run_relay(["trace", jobs.message_id(created_ms, seq)], env)
    assert traced.returncode == 0, traced.stderr
    occurrence = schedule.occurrence_id("ticker", "jobs.tick.handler", first)
    assert f"schedule occurrence {occurrence} (matching bypassed)" in traced.stdout
    traced_json = run_relay(["trace", jobs.message_id(created_ms, seq), "--json"], env)
    assert traced_json.returncode == 0, traced_json.stderr
    assert assert_matches_schema(traced_json.stdout)["classification"] == occurrence
