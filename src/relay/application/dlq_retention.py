"""``DLQ_RETENTION``: dead-letter entries older than the window are deleted, so the
dead-letter stream cannot grow without bound.

Off unless the variable is set. Unlike the event stream no consumer group reads
the dead letters, so nothing else can still need an entry: the cutoff is simply
``now - retention`` against when the entry was written (its id's milliseconds, on
both brokers). One pass shortly after start, then every ``retention / 24``
(clamped to 1 minute .. 1 hour, as the stream trimmer). A failed pass is one
warning and is retried at the next tick; it never stops the worker.
"""

from __future__ import annotations

import anyio
import structlog
from anyio.abc import TaskStatus

from relay.application.ports import Clock, DeadLetterTrim
from relay.application.ticker import tick_forever
from relay.domain.durations import MILLISECOND, SECOND
from relay.domain.errors import RelayError
from relay.domain.retention import trim_interval_ns

log = structlog.get_logger(__name__)

INITIAL_DELAY_NS = 5 * SECOND


class DeadLetterRetention:
    """Deletes dead letters older than ``retention_ns`` on a ticker."""

    def __init__(
        self,
        dead_letters: DeadLetterTrim,
        retention_ns: int,
        clock: Clock,
        *,
        initial_delay_ns: int = INITIAL_DELAY_NS,
    ) -> None:
        if retention_ns <= 0:
            raise ValueError("retention must be positive")
        self._dead_letters = dead_letters
        self._retention_ns = retention_ns
        self._clock = clock
        self._interval_ns = trim_interval_ns(retention_ns)
        self._initial_delay_ns = initial_delay_ns

    def cutoff_ms(self) -> int:
        return int(self._clock.now() * 1000) - self._retention_ns // MILLISECOND

    async def trim_once(self) -> int:
        cutoff = self.cutoff_ms()
        removed = await self._dead_letters.trim_before(cutoff)
        if removed:
            log.info(
                "dead_letters_expired",
                dlq=self._dead_letters.key,
                removed=removed,
                cutoff_ms=cutoff,
            )
        return removed

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Trim once shortly after start, then every interval; never returns."""
        log.info(
            "dlq_retention_started",
            dlq=self._dead_letters.key,
            retention_s=self._retention_ns / SECOND,
            interval_s=self._interval_ns / SECOND,
        )
        task_status.started()
        await tick_forever(
            self.trim_once,
            first_after_ns=self._initial_delay_ns,
            every_ns=self._interval_ns,
            retried=(RelayError, OSError),
            failed=lambda exc: log.warning(
                "dlq_trim_failed", dlq=self._dead_letters.key, error=str(exc)
            ),
        )
