"""``relay trace delayed-<ms>-<n>``: a delayed event's id on Redis (docs/producing.md).

A delayed publish on Redis answers with a delayed id, since the event is not in
the stream yet. While it waits, the trace says until when (its body is in
``relay:<stream>:delayed:events``). Once the mover has put it in the stream, the
entry carries the delayed id in its field ``delayed``: the trace finds it among
the entries from its due time on (at most ``SCAN_LIMIT`` of them) and traces that
entry, with one note on stderr naming the stream id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import typer

from relay.adapters.redis.keys import delayed_events_key, delayed_key
from relay.domain.errors import RelayError
from relay.domain.publication import delayed_due
from relay.entrypoints.cli.trace import MessageFacts, gather

if TYPE_CHECKING:
    from redis.asyncio import Redis

SCAN_LIMIT: Final = 10_000
_PAGE: Final = 500


async def gather_delayed(redis: Redis, stream: str, group: str, delayed: str) -> MessageFacts:
    """The facts of a delayed event: waiting, or those of the entry it became."""
    due = await redis.zscore(delayed_key(stream), delayed)
    if due is not None:
        seconds, micros = await redis.time()
        facts = MessageFacts(delayed, stream, group, int(seconds) * 1000 + int(micros) // 1000)
        body = await redis.hget(delayed_events_key(stream), delayed)
        facts.body_bytes = None if body is None else len(body)
        facts.delayed_until_ms = int(due)
        return facts
    entry = await moved_to(redis, stream, delayed)
    if entry is None:
        raise RelayError(
            f"delayed id {delayed} is not waiting, and no entry of the {SCAN_LIMIT} from its"
            f" due time on in stream {stream!r} carries it (never published there, or trimmed)"
        )
    typer.echo(f"relay: note: delayed id {delayed} entered the stream as {entry}", err=True)
    return await gather(redis, stream, group, entry)


async def moved_to(redis: Redis, stream: str, delayed: str) -> str | None:
    """The stream id of the entry moved from ``delayed``, scanning from its due time."""
    due = delayed_due(delayed)
    low = f"{due}-0"
    seen = 0
    while seen < SCAN_LIMIT:
        batch: Any = await redis.xrange(stream, low, "+", count=_PAGE)
        for entry_id, fields in batch:
            mark = (fields or {}).get(b"delayed", (fields or {}).get("delayed"))
            if mark is not None and _text(mark) == delayed:
                return _text(entry_id)
        seen += len(batch)
        if len(batch) < _PAGE:
            return None
        low = "(" + _text(batch[-1][0])
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
