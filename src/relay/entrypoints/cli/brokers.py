"""Which broker an admin command talks to, from the environment.

``RELAY_BROKER=sqlite`` opens the embedded broker file (``RELAY_BROKER_PATH``);
otherwise Redis (``REDIS_URI``, ``REDIS_STREAM``), exactly as before. The choice
itself is made once, in :func:`relay.adapters.admin.open_admin_broker`; this
module turns the settings and the broker's errors into one line and exit 1. The
adapters are imported inside the functions that use them: every admin command
imports this module, and each needs one broker at most.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import anyio

from relay.domain.errors import RelayError
from relay.entrypoints.cli.common import fail
from relay.entrypoints.config import BrokerSettings, RedisSettings, load_broker_settings

if TYPE_CHECKING:
    from relay.application.ports import AdminBroker, DeadLetterStore

T = TypeVar("T")
Settings = tuple[BrokerSettings, RedisSettings]


def broker_settings(*, need_group: bool = False) -> Settings:
    """The broker and stream settings, or one line and exit 1."""
    try:
        return load_broker_settings(os.environ, need_group=need_group)
    except RelayError as exc:
        fail("; ".join(str(exc).splitlines()))


def with_admin(
    settings: Settings, action: Callable[[AdminBroker], Awaitable[T]], *, create: bool = False
) -> T:
    """Run ``action(admin)`` on the configured broker's admin side; a ``RelayError``
    (unreachable broker, missing file) is one line and exit 1."""
    from relay.adapters.admin import open_admin_broker

    async def run() -> T:
        async with open_admin_broker(*settings, create=create) as admin:
            return await action(admin)

    try:
        return anyio.run(run)
    except RelayError as exc:
        fail(str(exc))


def with_dead_letters(settings: Settings, action: Callable[[DeadLetterStore], Awaitable[T]]) -> T:
    """Run ``action(store)`` with the selected broker's dead-letter store."""
    return with_admin(settings, lambda admin: action(admin.dead_letters))


def require_stream(settings: Settings, *, group: bool = False) -> None:
    """Exit 1 with one line unless the configured stream (and, with ``group``, the
    consumer group) exists on the selected broker. ``relay dlq ls`` calls this
    before answering, so a typo in ``REDIS_STREAM`` or ``REDIS_GROUP`` is an
    error, never an empty answer."""
    problem = with_admin(settings, lambda admin: admin.target_problem(group=group))
    if problem is not None:
        fail(problem)
