"""Replays the console asked for: one queue, paced as ``relay dlq replay`` paces.

A POST only queues the entry ids (a replay can take as long as its handler's
timeout, longer than any request may); one background task sends each as the
same :class:`ReplayDeadLetter` command the control socket sends, starting replay
``i`` no earlier than ``i / rate`` after the first of its batch. The entry is
deleted by the use case only after its handler succeeded. Recent outcomes are
kept (bounded) for the dead-letters page.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus

from relay.domain.commands import ReplayDeadLetter
from relay.domain.dlq_selection import DEFAULT_RATE, RateLimit, parse_rate
from relay.domain.errors import RelayError

_log = structlog.get_logger("relay.console")

QUEUE_LIMIT = 1_000
KEPT_OUTCOMES = 50


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    entry_id: str
    ok: bool
    detail: str
    at: float


class ReplayQueue:
    """Queued entry ids and the task that replays them; see the module docstring."""

    def __init__(self, send: Callable[[Any], Awaitable[Any]], rate: str = DEFAULT_RATE) -> None:
        self._send = send
        self._rate: RateLimit = parse_rate(rate)
        self._ids: deque[str] = deque()
        self._wake = anyio.Event()
        self.outcomes: deque[ReplayOutcome] = deque(maxlen=KEPT_OUTCOMES)

    @property
    def waiting(self) -> int:
        return len(self._ids)

    def add(self, ids: list[str]) -> int:
        """Queue what fits; how many were queued."""
        room = max(0, QUEUE_LIMIT - len(self._ids))
        queued = set(self._ids)
        fresh = [i for i in dict.fromkeys(ids) if i not in queued][:room]
        self._ids.extend(fresh)
        self._wake.set()
        return len(fresh)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            started, sent = time.monotonic(), 0
            while self._ids:
                await anyio.sleep(self._rate.wait_s(sent, time.monotonic() - started))
                sent += 1
                await self._one(self._ids.popleft())

    async def _one(self, entry_id: str) -> None:
        try:
            summary = await self._send(ReplayDeadLetter(entry_id=entry_id))
        except RelayError as exc:
            self.outcomes.appendleft(ReplayOutcome(entry_id, False, str(exc), time.time()))
            _log.info("console_replay_failed", entry_id=entry_id, error=str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - a bug must not stop the worker's loops
            _log.exception("console_replay_crashed", entry_id=entry_id)
            detail = f"{type(exc).__name__} (see the worker log)"
            self.outcomes.appendleft(ReplayOutcome(entry_id, False, detail, time.time()))
            return
        detail = f"{summary.function}/{summary.handler} ran in {summary.duration_s:.2f}s"
        self.outcomes.appendleft(ReplayOutcome(entry_id, True, detail, time.time()))
        _log.info("console_replayed", entry_id=entry_id)
