"""``relay dlq replay`` of a malformed message's entry: publish its payload again.

A malformed message has no handler to re-run; its entry keeps the whole payload
(:func:`relay.domain.dlq_event.dlq_event_text`), so the only replay there is, once
its cause is fixed (a producer's bug, a larger ``MAX_EVENT_BYTES``), is the same
bytes appended to the configured stream (``REDIS_STREAM``, whose DLQ holds the
entry) on the selected broker. The entry
is deleted only after that append returned its new message id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from relay.domain.dlq_event import dlq_event_bytes, republishable
from relay.domain.errors import RelayError
from relay.entrypoints.cli.brokers import with_dead_letters
from relay.entrypoints.cli.common import fail, out
from relay.entrypoints.config import BrokerSettings, RedisSettings

if TYPE_CHECKING:  # a type only: `relay dlq --help` imports no broker client
    from relay.domain.dead_letters import StoredDeadLetter

__all__ = ["republish_malformed"]


def republish_malformed(
    settings: tuple[BrokerSettings, RedisSettings], stored: StoredDeadLetter
) -> None:
    """Append the entry's exact payload to its stream, then delete the entry; or
    one line and exit 1 when the entry does not hold the whole payload."""
    entry = stored.entry
    if not republishable(entry.reason):
        fail(
            f"entry {stored.id} records a malformed message whose payload it does not hold "
            f"({entry.reason}): there is nothing to replay "
            f"(remove it with 'relay dlq rm {stored.id}')"
        )
    payload = dlq_event_bytes(entry.event)
    stream = settings[1].stream
    try:
        new_id = anyio.run(_append, settings, payload)
    except RelayError as exc:
        fail(f"replay of {stored.id} failed: {exc}; the entry is kept")
    with_dead_letters(settings, lambda reader: reader.discard(stored.id))
    out(
        f"Republished {stored.id} as {new_id} on stream {stream} "
        f"({len(payload)} bytes, a malformed message: no handler to re-run); entry removed"
    )


async def _append(settings: tuple[BrokerSettings, RedisSettings], payload: bytes) -> str:
    from relay.adapters.admin import open_admin_broker

    async with open_admin_broker(*settings) as admin:
        return await admin.append(payload)
