"""``relay function match DIR --from-stream|--from-dlq`` as an operator runs it, on a real
Redis stream with a real consumer group holding pending entries.

The counts are checked twice: against what was appended (known by construction) and
against the worker's own classification (:func:`relay.application.classify.classify`,
the function the dispatcher's plan calls) over the same entries with a catalog built the
way the worker's registry builds it. The group's pending list, last-delivered id,
entries-read counter and per-entry delivery counts must be exactly as before.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from relay.adapters.fs.templates import load_template
from relay.application.classify import classify
from relay.application.registry import ActiveFunction, Catalog
from relay.domain.outcome import Malformed, rfc3339
from relay.domain.retention import StreamId
from tests.json_schemas import assert_matches_schema

pytestmark = pytest.mark.redis

RELAY = str(Path(sys.executable).parent / "relay")
MAX_BYTES = 1024

TEMPLATES = {
    "users": """\
runtime: python3.14
events:
  - handler: events.created.handler
    pattern: {event_name: [INSERT], table_name: [users]}
  - handler: events.updated.handler
    pattern: {event_name: [MODIFY], table_name: [users]}
  - handler: events.recent.handler
    pattern:
      table_name: [users]
      new_image: {created_at: {gt: "now()-5m"}}
""",
    "orders": """\
runtime: python3.14
events:
  - handler: orders.big.handler
    pattern: {table_name: [orders], total: {gte: 100}}
  - handler: orders.kind.handler
    pattern: {detail: {kind: {prefix: ["order."]}}}
""",
}


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url)
    yield conn
    conn.close()


@pytest.fixture
def stream(client: redis.Redis) -> Iterator[str]:
    name = f"test-match-{uuid.uuid4().hex[:12]}"
    yield name
    client.delete(name, f"relay:{name}:dlq")


@pytest.fixture
def functions(tmp_path: Path) -> Path:
    for name, text in TEMPLATES.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "template.yaml").write_text(text)
    return tmp_path


def relay_match(
    redis_url: str, stream: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_"))}
    base |= {"REDIS_URI": redis_url, "REDIS_STREAM": stream, "MAX_EVENT_BYTES": str(MAX_BYTES)}
    return subprocess.run(
        [RELAY, "function", "match", *args],
        env=base | (env or {}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def entry_fields(rng: random.Random, now: float, kinds: Counter[str]) -> dict[Any, Any]:
    """One entry: matching, unmatched and malformed in a known mix."""
    roll = rng.randrange(20)
    if roll == 0:
        kinds["malformed"] += 1
        return {"event": b"{not json"}
    if roll == 1:
        kinds["malformed"] += 1
        return {"payload": b"{}"}  # no event field
    if roll == 2:
        kinds["malformed"] += 1
        return {"event": json.dumps({"pad": "x" * MAX_BYTES}).encode()}  # oversized
    kinds["event"] += 1
    event: dict[str, Any] = {
        "event_name": rng.choice(["INSERT", "MODIFY", "REMOVE"]),
        "table_name": rng.choice(["users", "orders", "other"]),
    }
    if rng.random() < 0.6:
        event["new_image"] = {"created_at": rfc3339(now - rng.choice([60, 3600]))}
    if rng.random() < 0.5:
        event["total"] = rng.choice([5, 100, 250])
    if rng.random() < 0.4:
        event["detail"] = {"kind": rng.choice(["order.placed", "refund"])}
    return {"event": json.dumps(event).encode()}


GROUP_FIELDS = ("name", "consumers", "pending", "last-delivered-id", "entries-read", "lag")


def group_state(client: redis.Redis, stream: str) -> dict[str, Any]:
    """Everything a read through the group would change (idle times excluded: they
    move by themselves)."""
    [group] = client.xinfo_groups(stream)
    consumers = client.xinfo_consumers(stream, "relay")
    pending = client.xpending_range(stream, "relay", min="-", max="+", count=10_000)
    return {
        "group": {k: group[k] for k in GROUP_FIELDS},
        "consumers": sorted((c["name"], c["pending"]) for c in consumers),
        "summary": client.xpending(stream, "relay"),
        "pending": [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pending],
        "length": client.xlen(stream),
    }


def worker_counts(client: redis.Redis, stream: str, functions: Path) -> dict[str, Any]:
    """What the worker's classification decides for every entry of the stream."""
    catalog = Catalog.of(
        {
            name: ActiveFunction(
                name=name,
                directory=str(functions / name),
                template=(template := load_template(functions / name / "template.yaml")),
                runtime=template.runtime,
                image="img",
                fingerprint=None,
                prepared_at=None,
            )
            for name in TEMPLATES
        },
        complete=True,
    )
    counts: Counter[str] = Counter()
    entries: Any = client.xrange(stream)
    for entry_id, fields in entries:
        at = StreamId.parse(entry_id).ms / 1000
        found = classify(fields.get(b"event"), MAX_BYTES, catalog, at)
        if isinstance(found, Malformed):
            counts["malformed"] += 1
            continue
        assert isinstance(found, list)
        counts["matched" if found else "unmatched"] += 1
        for match in found:
            counts[f"{match.function}/{match.rule.handler}"] += 1
    return dict(counts)


def test_a_dry_run_over_1000_entries_counts_like_the_worker_and_leaves_the_group_as_it_was(
    redis_url: str, client: redis.Redis, stream: str, functions: Path
) -> None:
    rng, kinds = random.Random(3), Counter[str]()
    for _ in range(1000):
        client.xadd(stream, entry_fields(rng, time.time(), kinds))
    client.xgroup_create(stream, "relay", id="0")
    delivered: Any = client.xreadgroup("relay", "worker-1", {stream: ">"}, count=300)
    ids = [entry_id for entry_id, _ in delivered[0][1]]
    client.xack(stream, "relay", *ids[:100])  # 200 stay pending
    before = group_state(client, stream)
    assert before["group"]["pending"] == 200

    result = relay_match(redis_url, stream, str(functions), "--from-stream", "--json")

    assert result.returncode == 0, result.stderr
    document = assert_matches_schema(result.stdout)
    assert group_state(client, stream) == before
    expected = worker_counts(client, stream, functions)
    assert document["entries"] == 1000
    assert document["limit_reached"] is True
    assert document["malformed"] == kinds["malformed"] == expected["malformed"]
    assert document["matched"] + document["unmatched"] == kinds["event"]
    assert (document["matched"], document["unmatched"]) == (
        expected["matched"],
        expected["unmatched"],
    )
    per_rule = {f"{r['function']}/{r['handler']}": r["matched"] for r in document["rules"]}
    assert per_rule == {k: expected.get(k, 0) for k in per_rule}
    assert len(per_rule) == 5
    assert 0 < per_rule["users/events.recent.handler"] < expected["matched"]


def test_since_and_limit_bound_what_is_read_newest_first(
    redis_url: str, client: redis.Redis, stream: str, functions: Path
) -> None:
    insert = json.dumps({"event_name": "INSERT", "table_name": "users"})
    old_ms = int(client.time()[0]) * 1000 - 2 * 3600 * 1000
    client.xadd(stream, {"event": insert}, id=f"{old_ms}-0")  # two hours old
    recent = [bytes(client.xadd(stream, {"event": insert})).decode() for _ in range(5)]  # type: ignore[arg-type]  # bytes: the client does not decode

    hour = relay_match(redis_url, stream, str(functions), "--from-stream", "--since", "1h",
                       "--json")  # fmt: skip
    capped = relay_match(redis_url, stream, str(functions), "--from-stream", "--limit", "2",
                         "--json")  # fmt: skip

    assert hour.returncode == 0, hour.stderr
    found = assert_matches_schema(hour.stdout)
    assert (found["entries"], found["matched"], found["since_ms"]) == (5, 5, 3_600_000)
    assert (found["newest_id"], found["oldest_id"]) == (recent[-1], recent[0])
    assert found["limit_reached"] is False
    two = assert_matches_schema(capped.stdout)
    assert (two["entries"], two["newest_id"], two["oldest_id"]) == (2, recent[-1], recent[-2])


def test_explain_names_the_failing_condition_and_a_broken_template_is_one_line(
    redis_url: str, client: redis.Redis, stream: str, functions: Path
) -> None:
    client.xadd(stream, {"event": json.dumps({"event_name": "REMOVE", "table_name": "users"})})
    (functions / "broken").mkdir()
    (functions / "broken" / "template.yaml").write_text("runtime: python3.14\nevents: 5\n")

    result = relay_match(redis_url, stream, str(functions), "--from-stream", "--explain")

    assert result.returncode == 1  # a template that cannot load fails the check
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"dry run: 1 entry of stream {stream!r} on redis")
    assert "nothing consumed or acknowledged" in lines[0]
    assert any("events.created.handler" in line for line in lines), (
        result.stdout
    )  # the valid functions were still evaluated
    assert any(
        line.strip().endswith('pattern.event_name: "REMOVE" is not one of ["INSERT"]')
        for line in lines
    ), result.stdout
    [broken] = [line for line in lines if "broken" in line]
    assert "invalid template, not evaluated: events:" in broken
    assert "Traceback" not in result.stderr


def test_from_dlq_reads_each_original_event_once_and_keeps_every_entry(
    redis_url: str, client: redis.Redis, stream: str, functions: Path
) -> None:
    client.xadd(stream, {"event": b"{}"})  # the stream exists
    dlq = f"relay:{stream}:dlq"
    insert = json.dumps({"event_name": "INSERT", "table_name": "users"})

    def dead(original: str, event: str, function: str, handler: str, reason: str) -> None:
        client.xadd(dlq, {
            "original_stream": stream, "original_id": original, "group": "relay",
            "consumer": "worker-1", "event": event, "reason": reason, "function": function,
            "handler": handler, "deliveries": "5", "handler_attempts": "5",
            "timestamp": "2026-01-02T03:04:05Z",
        })  # fmt: skip

    dead("1700000000000-0", insert, "users", "events.created.handler", "exit 1")
    dead("1700000000000-0", insert, "users", "events.updated.handler", "exit 1")  # same event
    dead("1700000000001-0", '{"pad": "xx... (300000 bytes, truncated)', "-", "-",
         "event is 300000 bytes, larger than MAX_EVENT_BYTES (262144)")  # fmt: skip
    before = client.xrange(dlq)

    result = relay_match(redis_url, stream, str(functions), "--from-dlq", "--json")

    assert result.returncode == 0, result.stderr
    document = assert_matches_schema(result.stdout)
    assert (document["source"], document["entries"]) == ("dlq", 2)
    assert (document["matched"], document["malformed"]) == (1, 1)
    assert document["malformed_samples"][0]["reason"].startswith("event is 300000 bytes")
    assert client.xrange(dlq) == before
    # dead letters outlive their stream: a deleted stream does not hide them
    client.delete(stream)
    again = relay_match(redis_url, stream, str(functions), "--from-dlq", "--json")
    assert again.returncode == 0, again.stderr
    assert assert_matches_schema(again.stdout)["entries"] == 2


@pytest.mark.parametrize("source", ["--from-stream", "--from-dlq"])
def test_a_stream_that_does_not_exist_is_one_line_and_exit_1(
    redis_url: str, stream: str, functions: Path, source: str
) -> None:
    result = relay_match(redis_url, stream, str(functions), source)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"relay: stream {stream!r} does not exist on this Redis (REDIS_STREAM names it)\n"
    )
