"""Domain events: facts observed by the state view, metrics, logs and the CLI."""

from __future__ import annotations

from relay.domain.messages import DomainEvent

__all__ = ["DomainEvent"]
