"""``relay trace`` shows a running invocation's token age, from a claim the real
ledger script took (its ``@at:<field>`` claim time)."""

from __future__ import annotations

import re

import anyio
import pytest
import redis.asyncio
from typer.testing import CliRunner

from relay.adapters.redis.ledger import RedisInvocationLedger
from relay.adapters.redis.stream import RedisEventStream
from relay.domain.outcome import BeginRequest, ClaimRequest, MessageContext
from relay.entrypoints.cli import app

pytestmark = pytest.mark.redis

FIELD = "users/events.created.handler"


async def _claim(redis_url: str, stream: str, group: str) -> str:
    """Deliver one message and claim its invocation with the real begin script."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        events = RedisEventStream(client, stream=stream, group=group, consumer="worker-1")
        await events.ensure_group()
        await client.xadd(stream, {"event": b'{"event_name": "INSERT"}'})
        [message] = await events.read(1, 10)
        result = await RedisInvocationLedger(client).begin(
            BeginRequest(
                context=MessageContext(
                    stream=stream, group=group, consumer="worker-1",
                    message_id=message.id, timestamp="2027-01-15T08:00:00.000Z",
                ),
                classification="matched:users",
                token="tok-abcdef123456",
                claims=(ClaimRequest(field=FIELD, max_attempts=5, lease_ms=300_000),),
                gates=(FIELD,),
            )
        )
        assert result.statuses[0].status == "claimed"
    finally:
        await client.aclose()
    return message.id


def test_trace_shows_how_long_ago_the_running_claim_was_taken(
    redis_url: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream, group = f"events-{unique}", f"relay-{unique}"
    message_id = anyio.run(_claim, redis_url, stream, group)
    monkeypatch.setenv("REDIS_URI", redis_url)
    monkeypatch.setenv("REDIS_STREAM", stream)
    monkeypatch.setenv("REDIS_GROUP", group)
    output = CliRunner().invoke(app, ["trace", message_id])
    assert output.exit_code == 0, output.output
    line = next(x for x in output.stdout.splitlines() if x.strip().startswith(FIELD))
    # Read right after the claim: an age in milliseconds or a few seconds.
    assert re.search(r"running attempt 1 \(claim tok-abcd\), claimed \d+m?s ago, protected", line)
    assert "@at:" not in output.stdout
    assert "Verdict:      an attempt is running" in output.stdout
