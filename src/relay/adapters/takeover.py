"""A protocol of ours on a connection another library opened.

Two hot paths speak their wire protocol themselves on a connection a client
library opened and still closes: the ledger's and the consumer's Redis
connections (opened by redis-py) and each execution container's attach
connection (opened by aiodocker over aiohttp). The library's own protocol is
replaced on the transport, but it must still hear when the connection ends, or
closing the library's side waits for it forever.

The transport may be asyncio's or uvloop's (uvloop's is not an
``asyncio.Transport`` subclass): only the methods both share are used, and
nothing checks a transport's type.
"""

from __future__ import annotations

import asyncio
from typing import Any


class TakenOver(asyncio.Protocol):
    """Installed on a transport in place of ``replaced``, the library's protocol.

    Subclasses call :meth:`release_replaced` from ``connection_lost``.
    """

    transport: Any = None
    replaced: asyncio.BaseProtocol | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def release_replaced(self, exc: Exception | None) -> None:
        """Tell the replaced protocol the connection ended (once)."""
        if self.replaced is not None:
            self.replaced.connection_lost(exc)
            self.replaced = None
