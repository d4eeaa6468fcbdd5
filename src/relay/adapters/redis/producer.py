"""Appending events to the Redis stream (``relay publish``, ingest, the DLQ republish),
and moving delayed events into it when they are due.

A plain publication is an ``XADD``. One with a due time or an idempotency key is
one ``lua/publish.lua`` call (the key's look-up, the append and the key's record
are one atomic step: two publishers of one key make one event). A delayed event
waits in the sorted set ``relay:<stream>:delayed`` (its body in
``relay:<stream>:delayed:events``) until :class:`DelayedMover`, which every
worker runs, moves it into the stream with ``lua/move_due.lua``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, Final

import anyio
import structlog
from anyio.abc import TaskStatus
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from relay.adapters.redis.keys import (
    delayed_events_key,
    delayed_key,
    delayed_seq_key,
    translated,
)
from relay.domain.durations import MILLISECOND
from relay.domain.publication import (
    DEFAULT_DEDUP_WINDOW_NS,
    Publication,
    check_all,
    due_ms,
    key_record,
)
from relay.domain.traceparent import TRACEPARENT_FIELD

_log = structlog.get_logger(__name__)

MOVE_TICK_S: Final = 0.2  # a due event reaches the stream within this (plus one read)
MOVE_BATCH: Final = 100  # events per script call: each call holds Redis briefly


def _lua(name: str) -> str:
    return resources.files("relay.adapters.redis").joinpath("lua", name).read_text()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisEventPublisher:
    """The :class:`EventPublisher` port on a Redis stream: one pipelined round trip
    per call; each id is returned once Redis has appended the entry (its
    durability is the server's ``appendfsync``, as for every write of Relay's).
    ``dedup_window_ns``: how long an idempotency key answers with its first id
    (``PUBLISH_DEDUP_WINDOW``; the record is a key expiring then). ``now_ms``: the
    clock the delay's bound is checked against (the due time itself is compared
    with the Redis server's clock by the mover)."""

    def __init__(
        self,
        client: Redis,
        stream: str,
        *,
        dedup_window_ns: int = DEFAULT_DEDUP_WINDOW_NS,
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        self._client = client
        self._stream = stream
        self._window_ms = str(max(1, dedup_window_ns // MILLISECOND))
        self._script = client.register_script(_lua("publish.lua"))
        self._now_ms = now_ms or _wall_ms
        self._keys = [stream, delayed_key(stream), delayed_events_key(stream),
                      delayed_seq_key(stream)]

    async def append(self, publications: Sequence[Publication]) -> list[str]:
        if not publications:
            return []
        now = self._now_ms()
        check_all(publications, now)
        calls = [self._call(p, now) for p in publications]
        async with self._client.pipeline(transaction=False) as pipe:
            for p, call in zip(publications, calls, strict=True):
                if call is None:
                    fields: dict[bytes | str, bytes | str] = {"event": p.payload}
                    if p.traceparent:  # beside the event, never inside it
                        fields[TRACEPARENT_FIELD] = p.traceparent
                    pipe.xadd(self._stream, fields)  # type: ignore[arg-type]
                else:  # EVALSHA itself: a pipeline's script support asks SCRIPT EXISTS first
                    pipe.evalsha(self._script.sha, len(call[0]), *call[0], *call[1])
            replies = await pipe.execute(raise_on_error=False)
        for i, reply in enumerate(replies):
            call = calls[i]
            # NOSCRIPT (a fresh or restarted server): that call did nothing; load and run
            # it now (after the batch's other entries: only then may the order differ)
            if isinstance(reply, NoScriptError) and call is not None:
                replies[i] = await self._script(keys=call[0], args=call[1])
            elif isinstance(reply, Exception):
                raise reply
        return [_text(r[0]) if isinstance(r, list) else _text(r) for r in replies]

    def _call(self, p: Publication, now: int) -> tuple[list[str], list[bytes | str]] | None:
        """The script's keys and arguments, or ``None`` for a plain ``XADD``."""
        due = due_ms(p.deliver_at_ms, now)
        if due is None and p.idempotency_key is None:
            return None
        keys = list(self._keys)
        if p.idempotency_key is not None:
            keys.append(key_record(self._stream, p.idempotency_key))
        due_text = "" if due is None else str(due)
        return keys, [p.payload, due_text, self._window_ms, p.traceparent or ""]


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class DelayedMover:
    """Moves ``stream``'s due delayed events into it, every :data:`MOVE_TICK_S`
    (at once again while a batch comes back full). Every worker runs one; the
    script moves each event exactly once however many run. A failed call (Redis
    away) is logged once and tried again at the next tick: the events wait,
    durable, in the set."""

    def __init__(self, client: Redis, stream: str, *, tick_s: float = MOVE_TICK_S) -> None:
        self._client = client
        self._keys = [stream, delayed_key(stream), delayed_events_key(stream)]
        self._script = client.register_script(_lua("move_due.lua"))
        self._tick_s = tick_s

    async def move_due(self) -> int:
        """Move up to :data:`MOVE_BATCH` due events; how many were moved."""
        with translated("delayed move"):
            return int(await self._script(keys=self._keys, args=[MOVE_BATCH]))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        failing = False
        while True:
            try:
                moved = await self.move_due()
            except Exception as exc:  # noqa: BLE001 - the mover never stops the worker
                if not failing:
                    _log.warning("delayed_move_failed", error=str(exc))
                failing, moved = True, 0
            else:
                if failing:
                    _log.info("delayed_move_recovered")
                failing = False
            if moved < MOVE_BATCH:
                await anyio.sleep(self._tick_s)
