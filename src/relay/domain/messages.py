"""Base classes for commands and domain events.

Commands are orders (``ReconcileFunction``); events are facts in the past tense
(``FunctionPrepared``). Both are frozen msgspec Structs so they are immutable,
cheap to build on the hot path, and serialisable for the control socket.
"""

from __future__ import annotations

import re

import msgspec


def command_tag(class_name: str) -> str:
    """A command's name on the control socket: ``ResetStats`` -> ``reset_stats``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", class_name).lower()


class Command(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
    tag_field="cmd", tag=command_tag,
):
    """An order sent on the bus; exactly one handler carries it out. Tagged and
    strict (an unknown field is an error), so a union of commands decodes straight
    from the control socket's JSON."""


class DomainEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A fact that happened; any number of subscribers observe it."""
