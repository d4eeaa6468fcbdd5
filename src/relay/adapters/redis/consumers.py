"""Removing this group's stale consumers: names left behind by workers that are gone.

A worker's consumer name is its hostname, so every recreated container with a new
hostname, and every host taken out of service, leaves a name in the group for good.
Such a name holds nothing for long (the recovery loop claims its pending entries once
their claims expire), but it stays in ``XINFO CONSUMERS`` and in every tool that
lists the group. Relay therefore removes, when it starts, the consumers of its own
group that hold **no** pending entries and have been idle for at least
:data:`STALE_CONSUMER_IDLE_MS`. A live worker re-issues its blocking read every few
seconds, so it is never that idle.

Deleting a consumer deletes its pending list with it, so the check and the delete are
one Lua script (atomic on the server): a consumer that took a message in between
cannot be deleted with it. The worker's own name is never deleted.
"""

from __future__ import annotations

from typing import Final

import structlog
from redis.asyncio import Redis

from relay.adapters.redis.keys import translated
from relay.domain.errors import DependencyUnavailable

log = structlog.get_logger(__name__)

STALE_CONSUMER_IDLE_MS: Final = 60 * 60 * 1000  # an hour: far beyond any live worker

# KEYS[1] stream; ARGV[1] group, ARGV[2] minimum idle ms, ARGV[3] the caller's own name.
# XINFO CONSUMERS answers one flat field/value list per consumer.
_PRUNE: Final = """
local removed = {}
for _, entry in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for i = 1, #entry, 2 do f[entry[i]] = entry[i + 1] end
  if f['name'] ~= ARGV[3] and tonumber(f['pending']) == 0
      and tonumber(f['idle']) >= tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
    removed[#removed + 1] = f['name']
  end
end
return removed
"""


async def remove_stale_consumers(
    client: Redis,
    *,
    stream: str,
    group: str,
    keep: str,
    min_idle_ms: int = STALE_CONSUMER_IDLE_MS,
) -> list[str]:
    """Delete the group's consumers other than ``keep`` that hold nothing and have
    been idle ``min_idle_ms`` or longer; return their names, sorted."""
    with translated("XGROUP DELCONSUMER"):
        reply = await client.eval(_PRUNE, 1, stream, group, str(min_idle_ms), keep)
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in reply or []]
    return sorted(names)


async def tidy_consumers(client: Redis, *, stream: str, group: str, keep: str) -> None:
    """:func:`remove_stale_consumers` at start-up, logged. A failure never stops the
    start (fail open): the names are clutter, not delivery state."""
    try:
        removed = await remove_stale_consumers(client, stream=stream, group=group, keep=keep)
    except DependencyUnavailable as exc:
        log.warning("stale_consumers_not_removed", error=str(exc))
        return
    if removed:
        log.info("stale_consumers_removed", consumers=removed, count=len(removed))
