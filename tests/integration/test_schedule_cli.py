"""``relay schedule ls`` against a real Redis and a real state database file."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import redis.asyncio
from typer.testing import CliRunner

from relay.adapters.redis.schedules import RedisOccurrencePublisher
from relay.adapters.sqlite.db import db_path, open_db
from relay.domain import schedule
from relay.entrypoints.cli import app
from tests.json_schemas import assert_matches_schema

pytestmark = [pytest.mark.redis]

AT = 1_900_000_000  # 2030-03-17T17:46:40Z


def _state(tmp_path: Path, fn: str) -> dict[str, str]:
    state = tmp_path / "state"
    db = open_db(db_path(state))
    db.upsert(
        "functions",
        fn,
        {
            "name": fn,
            "status": "ready",
            "schedules": [
                {"handler": "jobs.a", "cron": "0 3 * * *", "timezone": "Europe/Rome"},
                {"handler": "jobs.b", "cron": "*/10 * * * * *"},
            ],
        },
        "2030-03-17T00:00:00Z",
    )
    db.close()
    return {"RELAY_STATE_DIR": str(state), "RELAY_RUN_DIR": str(tmp_path / "run")}


async def _publish(url: str, stream: str, fn: str) -> None:
    client = redis.asyncio.Redis.from_url(url)
    try:
        publisher = RedisOccurrencePublisher(client, stream)
        for at in (AT - 86400, AT):
            await publisher.publish(schedule.envelope(fn, "jobs.a", at))
    finally:
        await client.aclose()


def test_schedule_ls_shows_the_last_published_and_the_next_occurrence(
    tmp_path: Path, redis_url: str, unique: str
) -> None:
    fn = f"fn-{unique}"
    anyio.run(_publish, redis_url, f"{unique}-events", fn)  # the command runs its own loop
    # the dedup keys are per stream: another stream's schedule ls sees none of them
    other = {**_state(tmp_path, fn), "REDIS_URI": redis_url, "REDIS_STREAM": f"{unique}-x"}
    assert "2030-03-17" not in CliRunner().invoke(app, ["schedule", "ls"], env=other).stdout
    env = {**_state(tmp_path, fn), "REDIS_URI": redis_url, "REDIS_STREAM": f"{unique}-events"}
    result = CliRunner().invoke(app, ["schedule", "ls"], env=env)
    assert result.exit_code == 0, result.output
    header, a, b = result.stdout.splitlines()
    assert header.split() == ["SCHEDULE", "CRON", "TIMEZONE", "LAST", "PUBLISHED", "NEXT"]
    assert a.startswith(f"{fn}/jobs.a")
    assert "2030-03-17T17:46:40Z" in a  # the latest of the two dedup keys
    assert "Europe/Rome)" in a
    assert b.startswith(f"{fn}/jobs.b")
    assert "  -  " in b  # never published
    as_json = CliRunner().invoke(app, ["schedule", "ls", "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    doc = assert_matches_schema(as_json.stdout)
    assert doc["last_published_error"] is None
    assert [(s["handler"], s["last_published"]) for s in doc["schedules"]] == [
        ("jobs.a", "2030-03-17T17:46:40Z"),
        ("jobs.b", None),
    ]
    assert doc["schedules"][0]["timezone"] == "Europe/Rome"
    assert doc["schedules"][1]["timezone"] == "UTC"


def test_schedule_ls_without_redis_says_unknown_in_one_line(tmp_path: Path) -> None:
    env = {**_state(tmp_path, "jobs"), "REDIS_URI": "redis://127.0.0.1:1"}
    result = CliRunner().invoke(app, ["schedule", "ls"], env=env)
    assert result.exit_code == 0
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("relay: last published occurrences unknown: ")
    assert "Traceback" not in result.output
    assert all("unknown" in line for line in result.stdout.splitlines()[1:])
