"""Periodic stream trimming that never loses work a consumer group still needs.

``REDIS_STREAM_RETENTION`` asks for entries older than the window to be trimmed.
A plain ``XTRIM key MINID ~ <cutoff>`` removes entries regardless of consumer
groups, so an entry still pending (or never delivered) in some group would vanish
and ``XAUTOCLAIM`` would later drop it: lost work. Two safe forms:

* Redis 8.2 and later: ``XTRIM key MINID ~ <cutoff> ACKED`` trims only entries
  that every group has read and acknowledged. Support is probed once with a real
  command that removes nothing, and the answer is cached.
* Older servers: the cutoff is clamped to every group's oldest pending entry and
  to the id after its last-delivered id (see :mod:`relay.domain.retention`).

A group created between the read of the group positions and the trim is treated
as if it had been created just after the trim (it misses only what was already
older than the window).
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import anyio
import structlog
from anyio.abc import TaskStatus
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from relay.application.ports import Clock
from relay.application.ticker import tick_forever
from relay.domain.durations import SECOND
from relay.domain.retention import (
    GroupPosition,
    StreamId,
    safe_cutoff,
    trim_interval_ns,
    window_cutoff,
)

log = structlog.get_logger(__name__)

INITIAL_DELAY_NS = 5 * SECOND
"""The first trim runs this long after start, so a large stream does not wait a tick."""

Mode = Literal["acked", "clamped"]


class TrimOutcome(NamedTuple):
    """What one trim pass did."""

    mode: Mode
    window: StreamId
    effective: StreamId
    limited_by: str | None
    removed: int


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def _command(redis: Redis, *args: str) -> Any:
    # redis-py leaves execute_command untyped; XTRIM's 8.2 options have no typed wrapper.
    return await redis.execute_command(*args)  # type: ignore[no-untyped-call]


class RetentionTrimmer:
    """Trims ``stream`` to ``retention_ns`` on a ticker; one per ``relay start``."""

    def __init__(
        self,
        redis: Redis,
        stream: str,
        retention_ns: int,
        clock: Clock,
        *,
        interval_ns: int | None = None,
        initial_delay_ns: int = INITIAL_DELAY_NS,
        approximate: bool = True,
    ) -> None:
        if retention_ns <= 0:
            raise ValueError("retention must be positive")
        self._redis = redis
        self._stream = stream
        self._retention_ns = retention_ns
        self._clock = clock
        self._interval_ns = (
            interval_ns if interval_ns is not None else trim_interval_ns(retention_ns)
        )
        self._initial_delay_ns = initial_delay_ns
        self._approximate = approximate
        self._acked_supported: bool | None = None
        self._held_by: str | None = None

    @property
    def interval_ns(self) -> int:
        return self._interval_ns

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Trim once shortly after start, then every interval; never returns.

        A failed pass is logged and retried on the next tick.
        """
        log.info(
            "retention_started",
            stream=self._stream,
            retention_s=self._retention_ns / SECOND,
            interval_s=self._interval_ns / SECOND,
        )
        task_status.started()
        await tick_forever(
            self.trim_once,
            first_after_ns=self._initial_delay_ns,
            every_ns=self._interval_ns,
            retried=(RedisError, OSError, ValueError),
            failed=lambda exc: log.warning(
                "stream_trim_failed", stream=self._stream, error=str(exc)
            ),
        )

    async def supports_acked(self) -> bool:
        """Whether the server knows ``XTRIM ... ACKED`` (Redis 8.2+), probed once.

        The probe ``XTRIM <stream> MINID 0 ACKED`` removes nothing; servers that
        do not know the option answer with a syntax error before touching the key.
        Connection errors propagate and leave the answer unknown.
        """
        if self._acked_supported is None:
            try:
                await _command(self._redis, "XTRIM", self._stream, "MINID", "0", "ACKED")
            except ResponseError as exc:
                if "syntax" not in str(exc).lower():
                    raise
                self._acked_supported = False
            else:
                self._acked_supported = True
            log.debug("retention_acked_probe", supported=self._acked_supported)
        return self._acked_supported

    def trim_command(self, cutoff: StreamId, *, acked: bool) -> list[str]:
        """The exact ``XTRIM`` argument list for ``cutoff``."""
        command = ["XTRIM", self._stream, "MINID", "~" if self._approximate else "=", str(cutoff)]
        if acked:
            command.append("ACKED")
        return command

    async def trim_once(self) -> TrimOutcome:
        """One trim pass; returns what it decided and how many entries went."""
        window = window_cutoff(int(self._clock.now() * 1000), self._retention_ns)
        if await self.supports_acked():
            mode: Mode = "acked"
            effective, limited_by = window, None
        else:
            mode = "clamped"
            cutoff = safe_cutoff(window, await self.group_positions())
            effective, limited_by = cutoff.effective, cutoff.limited_by
        removed = int(
            await _command(self._redis, *self.trim_command(effective, acked=mode == "acked"))
        )
        outcome = TrimOutcome(mode, window, effective, limited_by, removed)
        log.debug(
            "stream_trimmed",
            stream=self._stream,
            mode=mode,
            window_cutoff=str(window),
            effective_cutoff=str(effective),
            limited_by=limited_by,
            removed=removed,
        )
        self._note_hold(outcome)
        return outcome

    def _note_hold(self, outcome: TrimOutcome) -> None:
        """One INFO line when a group starts (or stops) holding retention back: a stuck
        group makes the stream grow past the window, which an operator should see."""
        if outcome.limited_by == self._held_by:
            return
        if outcome.limited_by is not None:
            log.info(
                "retention_held_back",
                stream=self._stream,
                group=outcome.limited_by,
                effective_cutoff=str(outcome.effective),
                window_cutoff=str(outcome.window),
            )
        else:
            log.info("retention_released", stream=self._stream, group=self._held_by)
        self._held_by = outcome.limited_by

    async def group_positions(self) -> list[GroupPosition]:
        """Every group's last-delivered id and oldest pending id."""
        try:
            groups = await self._redis.xinfo_groups(self._stream)
        except ResponseError as exc:
            if "no such key" in str(exc).lower():
                return []
            raise
        positions = []
        for info in groups:
            name = _text(info["name"])
            oldest: StreamId | None = None
            if int(info["pending"]) > 0:
                summary = await self._redis.xpending(self._stream, name)
                if summary["pending"] and summary["min"] is not None:
                    oldest = StreamId.parse(_text(summary["min"]))
            last = StreamId.parse(_text(info["last-delivered-id"]))
            positions.append(GroupPosition(name, last, oldest))
        return positions
