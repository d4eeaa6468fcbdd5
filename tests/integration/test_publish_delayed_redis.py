"""Delayed and idempotent publishes on a real Redis (issue 33): the publish script,
the mover every worker runs, and what survives a stop in between."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio
import structlog
from typer.testing import CliRunner, Result

from relay.adapters.metrics.backlog import redis_backlog_reader
from relay.adapters.redis.keys import delayed_events_key, delayed_key
from relay.adapters.redis.producer import MOVE_BATCH, DelayedMover, RedisEventPublisher
from relay.domain.publication import InvalidPublication, Publication, delayed_due, key_record
from relay.entrypoints.cli import app
from tests.integration.racing import race
from tests.json_schemas import assert_matches_schema
from tests.testbed import RedisServer

pytestmark = [pytest.mark.redis, pytest.mark.anyio]

REPO = Path(__file__).resolve().parents[2]


def event(n: int) -> bytes:
    return json.dumps({"kind": "job", "n": n}).encode()


async def server_ms(client: redis.asyncio.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def entries(client: redis.asyncio.Redis, stream: str) -> list[tuple[str, dict[str, Any]]]:
    rows: Any = await client.xrange(stream)
    return [(str(entry_id), fields) for entry_id, fields in rows]


async def test_a_delayed_publish_answers_a_delayed_id_naming_its_due_time(
    redis_client: redis.asyncio.Redis, unique: str
) -> None:
    """The id's shape is written twice (publish.lua and domain.publication): the
    same due time read back both ways."""
    stream = f"{unique}-events"
    due = await server_ms(redis_client) + 60_000
    publisher = RedisEventPublisher(redis_client, stream)
    ids = await publisher.append([Publication(event(n), deliver_at_ms=due) for n in range(3)])
    assert all(re.fullmatch(rf"delayed-{due}-\d+", i) for i in ids)
    assert [delayed_due(i) for i in ids] == [due] * 3
    assert len(set(ids)) == 3
    assert await entries(redis_client, stream) == []
    assert await redis_client.zcard(delayed_key(stream)) == 3
    await redis_client.xgroup_create(stream, "relay", id="0", mkstream=True)
    backlog = await redis_backlog_reader(redis_client, stream, "relay")()
    assert backlog.delayed == 3


async def test_the_mover_moves_nothing_before_its_time_and_everything_at_it(
    redis_client: redis.asyncio.Redis, unique: str
) -> None:
    stream = f"{unique}-events"
    due = await server_ms(redis_client) + 500
    publisher = RedisEventPublisher(redis_client, stream)
    [delayed] = await publisher.append([Publication(event(1), deliver_at_ms=due)])
    mover = DelayedMover(redis_client, stream)
    assert await mover.move_due() == 0
    with anyio.fail_after(10):
        while await mover.move_due() == 0:  # noqa: ASYNC110 - Redis's clock, no event
            await anyio.sleep(0.02)
    [(entry_id, fields)] = await entries(redis_client, stream)
    assert int(entry_id.split("-")[0]) >= due  # never before its time
    assert fields == {"event": event(1).decode(), "delayed": delayed}
    assert await redis_client.exists(delayed_key(stream), delayed_events_key(stream)) == 0


async def test_three_movers_move_each_due_event_exactly_once(
    redis_url: str, unique: str
) -> None:
    """Three workers' movers, each on its own connection, running at once over
    more due events than one batch: every event reaches the stream once."""
    stream = f"{unique}-events"
    clients = [redis.asyncio.Redis.from_url(redis_url, decode_responses=True) for _ in range(3)]
    try:
        due = await server_ms(clients[0]) + 300
        total = 3 * MOVE_BATCH + 17
        ids = await RedisEventPublisher(clients[0], stream).append(
            [Publication(event(n), deliver_at_ms=due) for n in range(total)]
        )
        movers = [DelayedMover(c, stream, tick_s=0.01) for c in clients]
        async with anyio.create_task_group() as tg:
            for mover in movers:
                tg.start_soon(mover.run)
            with anyio.fail_after(20):
                while await clients[0].xlen(stream) < total or await clients[0].zcard(  # noqa: ASYNC110 - Redis state
                    delayed_key(stream)
                ):
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()
        assert [await mover.move_due() for mover in movers] == [0, 0, 0]  # nothing left twice
        moved = await entries(clients[0], stream)
        assert sorted(fields["delayed"] for _, fields in moved) == sorted(ids)
        assert all(int(entry_id.split("-")[0]) >= due for entry_id, _ in moved)
    finally:
        for client in clients:
            await client.aclose()


async def test_delayed_events_wait_through_a_kill_of_redis_and_of_the_movers(
    persistent_redis: RedisServer, unique: str
) -> None:
    """Failure row 361: the workers are gone (and Redis itself is killed and
    restarted, with its append-only file) while events fall due; the next mover
    started moves every one of them, once."""
    stream = f"{unique}-events"
    client = redis.asyncio.Redis.from_url(persistent_redis.url, decode_responses=True)
    try:
        due = await server_ms(client) + 200
        ids = await RedisEventPublisher(client, stream).append(
            [Publication(event(n), deliver_at_ms=due + n) for n in range(5)]
        )
    finally:
        await client.aclose()
    await anyio.to_thread.run_sync(persistent_redis.kill)
    await anyio.to_thread.run_sync(persistent_redis.start)
    client = redis.asyncio.Redis.from_url(persistent_redis.url, decode_responses=True)
    try:
        with anyio.fail_after(10):
            while await server_ms(client) < due + 5:  # noqa: ASYNC110 - Redis's clock
                await anyio.sleep(0.02)
        assert await DelayedMover(client, stream).move_due() == 5
        moved = await entries(client, stream)
        assert [fields["delayed"] for _, fields in moved] == ids
    finally:
        await client.aclose()


async def test_a_key_published_twice_adds_one_entry_until_its_window_ends(
    redis_client: redis.asyncio.Redis, unique: str
) -> None:
    stream = f"{unique}-events"
    publisher = RedisEventPublisher(redis_client, stream, dedup_window_ns=300 * 10**6)
    [first] = await publisher.append([Publication(event(1), idempotency_key="order-1")])
    again = await publisher.append([Publication(event(2), idempotency_key="order-1"),
                                    Publication(event(3), idempotency_key="order-1")])
    assert again == [first, first]
    assert await redis_client.xlen(stream) == 1
    record = key_record(stream, "order-1")
    assert 0 < await redis_client.pttl(record) <= 300  # bounded: the record expires
    with anyio.fail_after(10):
        while await redis_client.exists(record):  # noqa: ASYNC110 - Redis's expiry
            await anyio.sleep(0.02)
    [later] = await publisher.append([Publication(event(4), idempotency_key="order-1")])
    assert later != first
    assert await redis_client.xlen(stream) == 2


async def test_a_delayed_keyed_publish_answers_its_delayed_id_again(
    redis_client: redis.asyncio.Redis, unique: str
) -> None:
    stream = f"{unique}-events"
    due = await server_ms(redis_client) + 60_000
    publisher = RedisEventPublisher(redis_client, stream)
    one = Publication(event(1), deliver_at_ms=due, idempotency_key="remind-u1")
    [first] = await publisher.append([one])
    assert await publisher.append([one]) == [first]
    assert await redis_client.zcard(delayed_key(stream)) == 1


async def test_bad_options_are_refused_before_anything_is_written(
    redis_client: redis.asyncio.Redis, unique: str
) -> None:
    stream = f"{unique}-events"
    publisher = RedisEventPublisher(redis_client, stream)
    with pytest.raises(InvalidPublication, match="characters"):
        await publisher.append([Publication(event(1)),
                                Publication(event(2), idempotency_key="has space")])
    far = await server_ms(redis_client) + 400 * 86_400_000
    with pytest.raises(InvalidPublication, match="365 days"):
        await publisher.append([Publication(event(1), deliver_at_ms=far)])
    assert await redis_client.exists(stream, delayed_key(stream)) == 0


_PUBLISHER = """
import json, sys
from pathlib import Path
import anyio
import redis.asyncio
from relay.adapters.redis.producer import RedisEventPublisher
from relay.domain.publication import Publication

async def main() -> None:
    url, stream, go, name = sys.argv[1:5]
    clients = [redis.asyncio.Redis.from_url(url) for _ in range(5)]
    while not Path(go).exists():  # both processes start together
        await anyio.sleep(0.005)
    async def one(client, n):
        payload = json.dumps({"from": name, "n": n}).encode()
        [mid] = await RedisEventPublisher(client, stream).append(
            [Publication(payload, idempotency_key="k-1")])
        print(mid, flush=True)
    async with anyio.create_task_group() as tg:
        for n, client in enumerate(clients):
            tg.start_soon(one, client, n)
    for client in clients:
        await client.aclose()

anyio.run(main)
"""


def test_two_processes_publishing_one_key_at_once_make_one_entry(
    redis_url: str, unique: str, tmp_path: Path
) -> None:
    stream = f"{unique}-events"
    go = tmp_path / "go"
    answers = race(_PUBLISHER, [redis_url, stream], go)
    assert len(answers) == 10
    assert len(set(answers)) == 1
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.xlen(stream) == 1
    finally:
        client.close()


async def test_trace_of_a_delayed_id_says_until_when_then_traces_the_entry_it_became(
    redis_client: redis.asyncio.Redis, redis_url: str, unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = f"{unique}-events"
    await redis_client.xgroup_create(stream, "relay", id="0", mkstream=True)
    monkeypatch.setenv("REDIS_URI", redis_url)
    monkeypatch.setenv("REDIS_STREAM", stream)
    monkeypatch.setenv("REDIS_GROUP", "relay")
    due = await server_ms(redis_client) + 400
    [delayed] = await RedisEventPublisher(redis_client, stream).append(
        [Publication(event(1), deliver_at_ms=due)]
    )
    waiting = await anyio.to_thread.run_sync(_trace, delayed, "--json")
    assert waiting.exit_code == 0, waiting.output
    document = assert_matches_schema(waiting.stdout)
    assert document["verdict"]["code"] == "delayed"
    assert document["delayed_until"] is not None
    text = await anyio.to_thread.run_sync(_trace, delayed)
    assert "Delayed:      until " in text.stdout
    with anyio.fail_after(10):
        while not await DelayedMover(redis_client, stream).move_due():  # noqa: ASYNC110 - Redis's clock
            await anyio.sleep(0.02)
    [(entry_id, _)] = await entries(redis_client, stream)
    moved = await anyio.to_thread.run_sync(_trace, delayed)
    assert moved.exit_code == 0, moved.output
    assert f"relay: note: delayed id {delayed} entered the stream as {entry_id}" in moved.stderr
    assert f"Message:      {entry_id} (stream {stream}, group relay)" in moved.stdout
    gone = await anyio.to_thread.run_sync(_trace, f"delayed-{due}-999999")
    assert gone.exit_code == 1
    assert "is not waiting, and no entry" in gone.stderr


def _trace(*args: str) -> Result:
    return CliRunner().invoke(app, ["trace", *args])


async def test_a_server_that_never_saw_the_script_loads_it_and_runs_it_once(
    restartable_redis: RedisServer, unique: str
) -> None:
    """A fresh server (or one restarted, or after SCRIPT FLUSH) answers NOSCRIPT to
    the pipelined EVALSHA: that call did nothing, so it is loaded and sent again."""
    stream = f"{unique}-events"
    client = redis.asyncio.Redis.from_url(restartable_redis.url)
    try:
        ids = await RedisEventPublisher(client, stream).append([
            Publication(event(1)),
            Publication(event(2), idempotency_key="once"),
            Publication(event(3), idempotency_key="once"),
        ])
        assert ids[1] == ids[2] != ids[0]
        assert await client.xlen(stream) == 2
    finally:
        await client.aclose()


async def test_a_publish_that_timed_out_and_is_retried_with_its_key_is_one_event(
    restartable_redis: RedisServer, unique: str
) -> None:
    """Failure row 360: Redis stalls, the producer's call times out, Redis then runs
    it after all; the producer retries with the same key and gets the first id."""
    stream = f"{unique}-events"
    client = redis.asyncio.Redis.from_url(restartable_redis.url, socket_timeout=0.5)
    publisher = RedisEventPublisher(client, stream)
    one = [Publication(event(1), idempotency_key="charge-42")]
    try:
        await publisher.append(one)  # the script is loaded: the stalled call is all there is
        await client.delete(stream, key_record(stream, "charge-42"))
        await anyio.to_thread.run_sync(restartable_redis.pause)
        try:
            with pytest.raises(redis.exceptions.TimeoutError):
                await publisher.append(one)
        finally:
            await anyio.to_thread.run_sync(restartable_redis.unpause)
        with anyio.fail_after(10):
            while not await client.exists(stream):  # noqa: ASYNC110 - the stalled call lands
                await anyio.sleep(0.02)
        [retried] = await publisher.append(one)
        rows: Any = await client.xrange(stream)
        assert [r[0].decode() for r in rows] == [retried]
    finally:
        await client.aclose()


async def test_a_mover_that_loses_redis_says_so_once_and_moves_on_when_it_is_back(
    persistent_redis: RedisServer, unique: str
) -> None:
    """Failure row 370: Redis goes away under a running mover; one warning, a try
    every tick, one line when it works again, and the event due meanwhile moved."""
    stream = f"{unique}-events"
    client = redis.asyncio.Redis.from_url(persistent_redis.url, decode_responses=True)
    try:
        due = await server_ms(client) + 300
        [delayed] = await RedisEventPublisher(client, stream).append(
            [Publication(event(1), deliver_at_ms=due)]
        )
        with structlog.testing.capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                await tg.start(DelayedMover(client, stream, tick_s=0.05).run)
                await anyio.to_thread.run_sync(persistent_redis.kill)
                with anyio.fail_after(10):
                    while not any(e["event"] == "delayed_move_failed" for e in logs):  # noqa: ASYNC110 - a log line
                        await anyio.sleep(0.02)
                await anyio.sleep(0.3)  # several more failing ticks
                await anyio.to_thread.run_sync(persistent_redis.start)
                with anyio.fail_after(20):
                    while not await client.exists(stream):  # noqa: ASYNC110 - Redis state
                        await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
        events = [e["event"] for e in logs]
        assert events.count("delayed_move_failed") == 1
        assert events.count("delayed_move_recovered") == 1
        assert [fields["delayed"] for _, fields in await entries(client, stream)] == [delayed]
    finally:
        await client.aclose()


async def test_the_producers_traceparent_rides_beside_a_delayed_or_keyed_event(
    redis_client: redis.asyncio.Redis, unique: str
) -> None:
    """The publish script and the mover keep a traceparent beside the event, as a
    plain XADD does; nothing of it is left once the event is moved."""
    stream = f"{unique}-events"
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    publisher = RedisEventPublisher(redis_client, stream)
    due = await server_ms(redis_client) + 300
    [delayed] = await publisher.append(
        [Publication(event(1), deliver_at_ms=due, traceparent=parent)]
    )
    [keyed] = await publisher.append(
        [Publication(event(2), idempotency_key=f"k-{unique}", traceparent=parent)]
    )
    mover = DelayedMover(redis_client, stream)
    with anyio.fail_after(10):
        while await mover.move_due() == 0:  # noqa: ASYNC110 - Redis's clock, no event
            await anyio.sleep(0.02)
    found = dict(await entries(redis_client, stream))
    assert found[keyed] == {"event": event(2).decode(), "traceparent": parent}
    [moved] = [f for i, f in found.items() if i != keyed]
    assert moved == {"event": event(1).decode(), "delayed": delayed, "traceparent": parent}
    assert await redis_client.exists(delayed_events_key(stream)) == 0
