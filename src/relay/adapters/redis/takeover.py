"""One connection of a redis-py pool, spoken through an ``asyncio.Protocol`` of ours.

The hot paths (the ledger's script calls, the consumer's blocking reads) skip
redis-py's per-command layers (pool checkout, retry wrapper, timeout context,
response callbacks) by talking RESP themselves. redis-py still opens the
connection, so everything the URL says applies (host and port or Unix socket,
user and password, database, TLS, the connect timeout); then the protocol takes
the transport over (see :class:`relay.adapters.takeover.TakenOver`). The
connection stays checked out of the pool, which closes it when the client is
closed. The commands are packed with :func:`bulk` and :func:`command`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from relay.adapters.takeover import TakenOver

OpenConnection = Callable[[TakenOver], Awaitable[None]]
"""Opens a new connection (connected, authenticated, database selected) and
attaches the given protocol to its transport (``connection_made``), or raises."""


def dedicated_connection(client: Redis) -> OpenConnection:
    """An :data:`OpenConnection` on one connection of ``client``'s pool that stays
    checked out: redis-py connects it (so the URL's every option applies), then
    the protocol takes its transport over. Opening again re-connects the same
    connection; the pool still closes it when the client is closed."""
    held: list[Any] = []

    async def open_connection(protocol: TakenOver) -> None:
        if held:
            conn = held[0]
            await conn.disconnect(nowait=True)
            await conn.connect()
        else:
            conn = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            held.append(conn)
        writer = getattr(conn, "_writer", None)  # redis-py's asyncio.StreamWriter
        if writer is None:
            raise RuntimeError("the redis connection has no stream to take over")
        transport = writer.transport
        protocol.replaced = transport.get_protocol()  # redis-py's StreamReaderProtocol
        transport.set_protocol(protocol)
        protocol.connection_made(transport)

    return open_connection


def bulk(*parts: bytes) -> bytes:
    """RESP bulk strings, without the array header."""
    return b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)


def command(*parts: bytes) -> bytes:
    """One RESP command: the array header, then its bulk strings."""
    return b"*%d\r\n" % len(parts) + bulk(*parts)
