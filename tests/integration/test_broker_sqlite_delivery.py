"""Relay's semantics on the embedded broker: retries with a persisted backoff,
exhaustion to the ``dlq`` table, malformed and oversized events dead-lettered at
once, and the admin commands (``relay dlq``, ``relay trace``) reading the file
with the same output as on Redis. The real dispatcher on a real file; the
container runtime is the in-memory fake.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from relay.domain.execution import InvocationResult
from relay.domain.outcome import DLQ_FIELDS
from tests.fakes import FakeClock
from tests.integration.broker_rows import rows
from tests.integration.broker_world import FIELD, BrokerWorld
from tests.json_schemas import assert_matches_schema

pytestmark = pytest.mark.anyio

RELAY = str(Path(sys.executable).with_name("relay"))
JOB = b'{"kind": "job", "n": 1}'


@pytest.fixture
def world(path: Path, clock: FakeClock) -> Iterator[BrokerWorld]:
    w = BrokerWorld(path, clock=clock, max_event_bytes=64, template={
        "events": [{"handler": "h.run", "pattern": {"kind": ["job"]}, "retries": 1}],
    })
    yield w
    w.close()


async def deliver_next(world: BrokerWorld) -> str:
    [message] = await world.stream.read(1, 0)
    await world.dispatch(message)
    return message.id


async def recover(world: BrokerWorld, min_idle_ms: int = 30_000) -> list[str]:
    reclaimed = await world.stream.reclaim(min_idle_ms, 10)
    for message in reclaimed.messages:
        await world.dispatch(message)
    return [m.id for m in reclaimed.messages]


def relay(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(path)}
    env.pop("REDIS_URI", None)
    return subprocess.run([RELAY, *args], env=env, capture_output=True, text=True, timeout=60,
                          check=False)


async def test_retries_back_off_on_disk_then_exhaust_into_the_dlq_table(
    path: Path, world: BrokerWorld, clock: FakeClock
) -> None:
    """Row 81: a failing handler with ``retries: 1`` backs off (the backoff is a
    ledger row in the file, so a restart keeps it), is not run again before the
    backoff ends, then exhausts: one DLQ row with every field a Redis DLQ entry
    has, written in the transaction that acknowledges the job."""
    world.runtime.script[FIELD] = InvocationResult(ok=False, error="boom")
    [mid] = await world.publisher.publish([(JOB, None)])
    await deliver_next(world)
    [(marker,)] = rows(path, "SELECT value FROM ledger WHERE field = ?", FIELD)
    assert marker.startswith("next_attempt_at:")
    clock.advance(31)  # the lease is idle, but the 1m backoff ...
    assert await recover(world) == [mid]
    assert len(world.runtime.requests) == 1  # ... is not over yet: a delayed job waits
    clock.advance(31)
    assert await recover(world) == [mid]
    assert len(world.runtime.requests) == 2
    [(state,)] = rows(path, "SELECT state FROM jobs")
    assert state == "acked"
    [entry] = rows(path, "SELECT original_stream, original_id, grp, consumer, event, reason,"
                         " function, handler, deliveries, handler_attempts, timestamp FROM dlq")
    fields = dict(zip(DLQ_FIELDS, entry, strict=True))
    assert fields["original_id"] == mid
    assert (fields["original_stream"], fields["group"]) == ("events", "relay")
    assert (fields["function"], fields["handler"], fields["handler_attempts"]) == ("fn", "h.run", 2)
    assert fields["event"] == JOB.decode()
    assert fields["deliveries"] == 3
    assert fields["reason"].startswith("retries exhausted after 2 attempt(s)")


async def test_trace_shows_the_last_error_while_the_invocation_backs_off(
    path: Path, world: BrokerWorld
) -> None:
    """The failed attempt's error is a ledger row of the file (``@err:<field>``)
    from the first failure on: ``relay trace`` shows it with the attempt and the
    next attempt time, as on Redis."""
    error = 'function "fn" handler "h.run": ValueError: first try'
    world.runtime.script[FIELD] = InvocationResult(ok=False, error=error)
    [mid] = await world.publisher.publish([(JOB, None)])
    await deliver_next(world)
    assert rows(path, "SELECT value FROM ledger WHERE field = ?", f"@err:{FIELD}") == [(error,)]
    traced = await anyio.to_thread.run_sync(relay, path, "trace", mid)
    assert traced.returncode == 0, traced.stderr
    assert "attempt 1 failed; next attempt at" in traced.stdout
    assert f"last error: {error}" in traced.stdout
    as_json = await anyio.to_thread.run_sync(relay, path, "trace", mid, "--json")
    [invocation] = assert_matches_schema(as_json.stdout)["invocations"]
    assert (invocation["state"], invocation["attempt"]) == ("backing_off", 1)
    assert invocation["last_error"] == error


async def test_malformed_and_oversized_events_are_dead_lettered_at_once(
    path: Path, world: BrokerWorld
) -> None:
    """Row 81: no handler runs; one placeholder entry each; both acknowledged."""
    big = b'{"kind": "job", "pad": "' + b"x" * 100 + b'"}'
    await world.publisher.publish([(b"not json", None), (big, None)])
    await deliver_next(world)
    await deliver_next(world)
    assert world.runtime.requests == []
    assert rows(path, "SELECT state FROM jobs") == [("acked",), ("acked",)]
    reasons = rows(path, "SELECT function, handler, handler_attempts, reason FROM dlq")
    assert [r[:3] for r in reasons] == [("-", "-", 0), ("-", "-", 0)]
    assert reasons[0][3].startswith("event is not valid JSON")
    assert reasons[1][3] == "event is 126 bytes, larger than MAX_EVENT_BYTES (64)"


async def test_dlq_and_trace_read_the_file_with_the_redis_output(
    path: Path, world: BrokerWorld, clock: FakeClock
) -> None:
    """Row 81: ``relay dlq ls|inspect|rm`` and ``relay trace`` on the embedded broker."""
    world.runtime.script[FIELD] = InvocationResult(ok=False, error="boom")
    [mid] = await world.publisher.publish([(JOB, None)])
    await deliver_next(world)
    clock.advance(121)
    await recover(world)
    [(created, seq)] = rows(path, "SELECT created_ms, seq FROM dlq")
    entry_id = f"{created}-{seq}"
    listed = await anyio.to_thread.run_sync(relay, path, "dlq", "ls")
    assert listed.returncode == 0, listed.stderr
    header, line = listed.stdout.splitlines()
    assert header.split() == ["ID", "ORIGINAL", "FUNCTION", "HANDLER", "ATTEMPTS", "AGE"]
    assert line.split()[:5] == [entry_id, mid, "fn", "h.run", "2"]
    shown = await anyio.to_thread.run_sync(relay, path, "dlq", "inspect", entry_id)
    assert shown.returncode == 0, shown.stderr
    assert mid in shown.stdout
    traced = await anyio.to_thread.run_sync(relay, path, "trace", mid)
    assert traced.returncode == 0, traced.stderr
    assert "Dead letters:" in traced.stdout
    assert entry_id in traced.stdout
    removed = await anyio.to_thread.run_sync(relay, path, "dlq", "rm", entry_id)
    assert removed.stdout.strip() == f"Removed {entry_id}"
    again = await anyio.to_thread.run_sync(relay, path, "dlq", "rm", entry_id)
    assert again.returncode == 1
    assert again.stderr.strip() == f"relay: no dead-letter entry {entry_id} in {path} (dlq)"


async def test_an_open_breaker_holds_jobs_on_the_embedded_broker_until_its_probe_closes_it(
    path: Path, clock: FakeClock
) -> None:
    """Row 101: the breaker on the embedded broker. Two failures open it; the jobs
    delivered next are held (no ledger row: no attempt charged), stay leased, and
    are never dead-lettered; after the cooldown the recovery pass lets one probe
    through, it succeeds, and every job is acknowledged with an empty DLQ table."""
    world = BrokerWorld(path, clock=clock, template={
        "concurrency": 1,
        "breaker": {"failures": 2, "cooldown": "30s"},
        "events": [{"handler": "h.run", "pattern": {"kind": ["job"]}, "retries": 5}],
    })
    try:
        world.runtime.script[FIELD] = InvocationResult(ok=False, error="connection refused")
        ids = await world.publisher.publish(
            [(b'{"kind": "job", "n": %d}' % n, None) for n in range(4)]
        )
        for _ in ids:
            await deliver_next(world)
        assert len(world.runtime.requests) == 2  # the two that opened it
        assert world.breakers.snapshot("fn").state == "open"
        # a ledger row only for the two that ran: the held ones were never charged
        assert rows(path, "SELECT count(*) FROM ledger WHERE field = ?", FIELD) == [(2,)]
        assert rows(path, "SELECT count(*) FROM dlq") == [(0,)]
        assert rows(path, "SELECT count(*) FROM jobs WHERE state = 'leased'") == [(4,)]

        del world.runtime.script[FIELD]  # the downstream is back
        clock.advance(31)  # the cooldown, and the held leases are idle
        await recover(world)
        assert world.breakers.snapshot("fn").state == "closed"
        clock.advance(61)  # the 1m backoff of the two that failed
        await recover(world)
        assert rows(path, "SELECT count(*) FROM jobs WHERE state = 'acked'") == [(4,)]
        assert rows(path, "SELECT count(*) FROM dlq") == [(0,)]
        assert len(world.runtime.requests) == 6  # 2 failures + 4 successes, nothing lost
    finally:
        world.close()
