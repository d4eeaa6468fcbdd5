"""``relay trace`` against a real Redis: the ledger, the pending list and the DLQ."""

from __future__ import annotations

import time

import pytest
import redis
import typer
from typer.testing import CliRunner

from relay.adapters.redis.keys import dlq_key, invocation_key
from relay.entrypoints.cli import app
from relay.entrypoints.cli.brokers import require_stream
from relay.entrypoints.config import BrokerSettings, RedisSettings
from tests.json_schemas import assert_matches_schema

pytestmark = pytest.mark.redis


def _trace_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, stream: str, group: str) -> None:
    """What ``relay trace`` reads to find the stream and group."""
    monkeypatch.setenv("REDIS_URI", redis_url)
    monkeypatch.setenv("REDIS_STREAM", stream)
    monkeypatch.setenv("REDIS_GROUP", group)


def _delivered(client: redis.Redis, stream: str, group: str, body: str) -> str:
    """A new group on ``stream`` and one message it delivered to ``worker-1`` (pending)."""
    client.xgroup_create(stream, group, id="0", mkstream=True)
    message_id = str(client.xadd(stream, {"event": body}))
    client.xreadgroup(group, "worker-1", {stream: ">"}, count=1)
    return message_id


def test_trace_shows_a_retried_invocation_and_its_dead_letter(
    redis_url: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream, group = f"events-{unique}", f"relay-{unique}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        message_id = _delivered(client, stream, group, '{"event_name": "INSERT"}')
        now_ms = int(time.time() * 1000)
        ledger = invocation_key(stream, group, message_id)
        client.hset(
            ledger,
            mapping={
                "@class": "matched:users",
                "users/events.created.handler": "ok",
                "users/events.updated.handler": f"next_attempt_at:{now_ms + 90_000}#2",
                "@err:users/events.updated.handler": "boom",
                "users/events.deleted.handler": "exhausted:5:dlq",
            },
        )
        client.xadd(
            dlq_key(stream),
            {
                "original_stream": stream,
                "original_id": message_id,
                "group": group,
                "consumer": "worker-1",
                "event": "{}",
                "reason": "exhausted after 5 attempts: x",
                "function": "users",
                "handler": "events.deleted.handler",
                "deliveries": "6",
                "handler_attempts": "5",
                "timestamp": "2026-01-01T00:00:00Z",
            },
        )
        client.xadd(dlq_key(stream), {"original_id": "1-0", "function": "other"})
        _trace_env(monkeypatch, redis_url, stream, group)
        result = CliRunner().invoke(app, ["trace", message_id])
        as_json = CliRunner().invoke(app, ["trace", message_id, "--json"])
    finally:
        client.close()
    assert result.exit_code == 0, result.output
    assert as_json.exit_code == 0, as_json.output
    text = result.stdout
    assert f"Message:      {message_id}" in text
    assert "Pending:      yes, with consumer worker-1" in text
    assert "delivered 1 time)" in text
    assert "Classified:   matched: users" in text
    assert "users/events.created.handler  completed" in text
    assert "attempt 2 failed; next attempt at" in text
    assert "(in 1m" in text
    assert "last error: boom" in text
    assert "exhausted after 5 attempts; its DLQ entry is written" in text
    assert "users/events.deleted.handler  attempts=5 deliveries=6" in text
    assert "other" not in text
    assert "Verdict:      waiting out a retry backoff" in text
    doc = assert_matches_schema(as_json.stdout)
    assert doc["classification"] == "matched:users"
    assert doc["matched_functions"] == ["users"]
    states = {i["handler"]: (i["state"], i["attempt"]) for i in doc["invocations"]}
    assert states == {
        "events.created.handler": ("completed", None),
        "events.deleted.handler": ("exhausted", 5),
        "events.updated.handler": ("backing_off", 2),
    }
    updated = next(i for i in doc["invocations"] if i["handler"] == "events.updated.handler")
    assert updated["last_error"] == "boom"
    assert updated["deadline"].endswith("Z")
    [dead] = doc["dead_letters"]
    assert (dead["function"], dead["attempts"], dead["deliveries"]) == ("users", 5, 6)
    assert doc["verdict"]["code"] == "backing_off"


def test_trace_of_an_unknown_message(
    redis_url: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream, group = f"events-{unique}", f"relay-{unique}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.xgroup_create(stream, group, id="0", mkstream=True)
    finally:
        client.close()
    _trace_env(monkeypatch, redis_url, stream, group)
    result = CliRunner().invoke(app, ["trace", "1-0"])
    assert result.exit_code == 0, result.output
    assert "Event:        gone" in result.stdout
    assert "Pending:      no" in result.stdout
    assert "Verdict:      unknown" in result.stdout
    as_json = CliRunner().invoke(app, ["trace", "1-0", "--json"])
    assert as_json.exit_code == 0, as_json.output
    doc = assert_matches_schema(as_json.stdout)
    assert doc["verdict"]["code"] == "unknown"
    assert doc["event"] == {"present": False, "bytes": None}
    assert doc["pending"] is None
    bad = CliRunner().invoke(app, ["trace", "not-an-id"])
    assert bad.exit_code == 1
    assert "is not a stream message id" in bad.output


def test_a_wrong_stream_or_group_is_an_error_never_an_unknown_message(
    redis_url: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo in REDIS_STREAM or REDIS_GROUP used to print "Verdict: unknown" with
    exit 0: the answer for a message that does not exist. It is one line naming the
    variable to fix, exit 1, and no document on stdout with --json."""
    stream, group = f"events-{unique}", f"relay-{unique}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        message_id = _delivered(client, stream, group, '{"k": 1}')
        client.xgroup_create(stream, f"other-{unique}", id="0")
        client.set(f"plain-{unique}", "x")
        cases = {
            (f"evnets-{unique}", group): (
                f"relay: stream 'evnets-{unique}' does not exist (REDIS_STREAM names it)\n"
            ),
            (stream, f"rely-{unique}"): (
                f"relay: group 'rely-{unique}' does not exist on stream '{stream}' (REDIS_GROUP"
                f" names it; its groups: other-{unique}, relay-{unique})\n"
            ),
            (f"plain-{unique}", group): (
                f"relay: key 'plain-{unique}' is not a stream (REDIS_STREAM names it)\n"
            ),
        }
        for (wrong_stream, wrong_group), line in cases.items():
            _trace_env(monkeypatch, redis_url, wrong_stream, wrong_group)
            for extra in ([], ["--json"]):
                result = CliRunner().invoke(app, ["trace", message_id, *extra])
                assert result.exit_code == 1, result.output
                assert result.stdout == ""
                assert result.stderr == line
        _trace_env(monkeypatch, redis_url, stream, group)
        right = CliRunner().invoke(app, ["trace", message_id, "--json"])
    finally:
        client.close()
    assert right.exit_code == 0, right.output
    assert assert_matches_schema(right.stdout)["pending"]["consumer"] == "worker-1"


def test_trace_says_when_only_the_acknowledgment_is_missing(
    redis_url: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every matched function ran to an end (one completed, one dead-lettered) and
    the message is still pending: the verdict names the failed acknowledgment.
    With a matched function that has no invocation yet (still building), it
    does not."""
    stream, group = f"events-{unique}", f"relay-{unique}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    _trace_env(monkeypatch, redis_url, stream, group)
    try:
        message_id = _delivered(client, stream, group, '{"kind": "x"}')
        ledger = invocation_key(stream, group, message_id)
        client.hset(
            ledger,
            mapping={
                "@class": "matched:users,audit",
                "users/events.created.handler": "ok",
                "audit/log.handler": "exhausted:1:dlq",
            },
        )
        settled = CliRunner().invoke(app, ["trace", message_id])
        settled_json = CliRunner().invoke(app, ["trace", message_id, "--json"])
        client.hset(ledger, "@class", "matched:users,audit,billing")
        building = CliRunner().invoke(app, ["trace", message_id])
    finally:
        client.close()
    assert settled.exit_code == 0, settled.output
    assert assert_matches_schema(settled_json.stdout)["verdict"]["code"] == "ack_missing"
    assert "Verdict:      every invocation is finished but the acknowledgment failed" in (
        settled.stdout
    )
    assert building.exit_code == 0, building.output
    assert "Verdict:      pending; the recovery loop will redeliver it" in building.stdout


def test_require_stream_is_the_shared_check_for_the_read_commands(
    redis_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``brokers.require_stream``: what ``relay dlq ls`` calls before listing (its
    group is only checked when asked for)."""
    stream, group = f"events-{unique}", f"relay-{unique}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        client.xgroup_create(stream, group, id="0", mkstream=True)
    finally:
        client.close()
    broker = BrokerSettings()
    require_stream((broker, RedisSettings(redis_url, stream, group)), group=True)
    require_stream((broker, RedisSettings(redis_url, stream, "nope")))  # group not asked for
    assert capsys.readouterr().err == ""
    for settings, asked in (
        (RedisSettings(redis_url, f"x-{unique}", group), False),
        (RedisSettings(redis_url, stream, "nope"), True),
    ):
        with pytest.raises(typer.Exit) as exited:
            require_stream((broker, settings), group=asked)
        assert exited.value.exit_code == 1
        line = capsys.readouterr().err
        assert line.startswith("relay: ")
        assert line.count("\n") == 1
        assert redis_url not in line
