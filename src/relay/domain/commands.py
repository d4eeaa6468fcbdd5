"""Commands: everything that changes Relay's state is one of these.

Each area adds its commands here; ``relay.application.handlers`` maps each to
exactly one handler, and a unit test checks the table is complete.
"""

from __future__ import annotations

from relay.domain.messages import Command

__all__ = ["Command"]
