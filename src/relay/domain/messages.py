"""Base classes for commands and domain events.

Commands are orders (``PrepareFunction``); events are facts in the past tense
(``FunctionPrepared``). Both are frozen msgspec Structs so they are immutable,
cheap to build on the hot path, and serialisable for the control socket.
"""

from __future__ import annotations

import msgspec


class Command(msgspec.Struct, frozen=True, kw_only=True):
    """An order sent on the bus; exactly one handler carries it out."""


class DomainEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A fact that happened; any number of subscribers observe it."""
