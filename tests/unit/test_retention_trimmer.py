"""The trimmer's command choice and its loop, against a recording stand-in for Redis.

The real server here is 7.x, so the ``XTRIM ... ACKED`` path (Redis 8.2+) is
proven by the exact command it sends; the clamping path runs against real Redis
in ``tests/integration/test_retention_redis.py``.
"""

from __future__ import annotations

from typing import Any, cast

import anyio
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from structlog.testing import capture_logs

from relay.adapters.redis.retention import RetentionTrimmer
from relay.domain.durations import MILLISECOND, parse_duration
from relay.domain.retention import StreamId
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio


class RecordingRedis:
    """Answers XTRIM like a server of the chosen generation; records every command."""

    def __init__(self, *, acked: bool, failures: int = 0) -> None:
        self.acked = acked
        self.failures = failures
        self.commands: list[tuple[str, ...]] = []
        self.trimmed = anyio.Event()
        self.groups: list[dict[str, Any]] = [
            {"name": b"g", "pending": 1, "last-delivered-id": b"900-0"}
        ]

    async def execute_command(self, *args: str) -> Any:
        if self.failures:
            self.failures -= 1
            raise RedisConnectionError("connection refused")
        self.commands.append(args)
        if "ACKED" in args and not self.acked:
            raise ResponseError("syntax error")
        if len(args) == 6:
            self.trimmed.set()
        return 3 if args[3:4] != ("0",) else 0

    async def xinfo_groups(self, stream: str) -> list[dict[str, Any]]:
        self.commands.append(("XINFO", "GROUPS", stream))
        return self.groups

    async def xpending(self, stream: str, group: str) -> dict[str, Any]:
        self.commands.append(("XPENDING", stream, group))
        return {"pending": 1, "min": b"400-2", "max": b"400-2", "consumers": []}


def make(fake: RecordingRedis, **kwargs: Any) -> RetentionTrimmer:
    clock = FakeClock(now=1000.0)  # window cutoff 999000-0 with a 1s retention
    return RetentionTrimmer(cast(Redis, fake), "s", parse_duration("1s"), clock, **kwargs)


async def test_acked_servers_trim_the_window_with_acked_and_no_group_reads() -> None:
    fake = RecordingRedis(acked=True)
    outcome = await make(fake).trim_once()
    assert fake.commands == [
        ("XTRIM", "s", "MINID", "0", "ACKED"),  # the probe, which removes nothing
        ("XTRIM", "s", "MINID", "~", "999000-0", "ACKED"),
    ]
    assert outcome.mode == "acked"
    assert outcome.effective == StreamId(999_000, 0)
    assert outcome.removed == 3


async def test_the_probe_answer_is_cached() -> None:
    fake = RecordingRedis(acked=True)
    trimmer = make(fake)
    await trimmer.trim_once()
    await trimmer.trim_once()
    probes = [c for c in fake.commands if c == ("XTRIM", "s", "MINID", "0", "ACKED")]
    assert len(probes) == 1


async def test_older_servers_clamp_to_the_oldest_pending_entry() -> None:
    fake = RecordingRedis(acked=False)
    with capture_logs() as logs:
        outcome = await make(fake).trim_once()
    assert fake.commands[-1] == ("XTRIM", "s", "MINID", "~", "400-2")
    assert outcome.mode == "clamped"
    assert outcome.limited_by == "g"
    trimmed = [e for e in logs if e["event"] == "stream_trimmed"]
    assert trimmed[0]["log_level"] == "debug"
    assert trimmed[0]["effective_cutoff"] == "400-2"


def test_exact_trimming_is_available_for_tests() -> None:
    trimmer = make(RecordingRedis(acked=True), approximate=False)
    assert trimmer.trim_command(StreamId(5, 1), acked=True) == [
        "XTRIM",
        "s",
        "MINID",
        "=",
        "5-1",
        "ACKED",
    ]


def test_interval_defaults_to_a_24th_of_the_window_clamped() -> None:
    assert make(RecordingRedis(acked=True)).interval_ns == parse_duration("1m")
    assert make(RecordingRedis(acked=True), interval_ns=7).interval_ns == 7


async def test_failures_are_logged_and_the_loop_keeps_going() -> None:
    fake = RecordingRedis(acked=True, failures=2)
    trimmer = make(fake, interval_ns=MILLISECOND, initial_delay_ns=0)
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(trimmer.run)
            with anyio.fail_after(5):
                await fake.trimmed.wait()
            tg.cancel_scope.cancel()
    failures = [e for e in logs if e["event"] == "stream_trim_failed"]
    assert len(failures) == 2
    assert failures[0]["log_level"] == "warning"


def test_retention_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        RetentionTrimmer(cast(Redis, RecordingRedis(acked=True)), "s", 0, FakeClock())


async def test_a_group_holding_retention_back_is_logged_once_at_info() -> None:
    fake = RecordingRedis(acked=False)
    trimmer = make(fake)
    with capture_logs() as logs:
        await trimmer.trim_once()
        await trimmer.trim_once()
    held = [e for e in logs if e["event"] == "retention_held_back"]
    assert len(held) == 1
    assert (held[0]["log_level"], held[0]["group"]) == ("info", "g")
    assert held[0]["effective_cutoff"] == "400-2"
    fake.groups = [{"name": b"g", "pending": 0, "last-delivered-id": b"999999-0"}]
    with capture_logs() as logs:
        await trimmer.trim_once()
    released = [e for e in logs if e["event"] == "retention_released"]
    assert [(e["log_level"], e["group"]) for e in released] == [("info", "g")]
