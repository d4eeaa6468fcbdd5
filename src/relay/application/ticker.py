"""The one loop of Relay's periodic housekeeping: a first pass shortly after start,
then one every interval, for ever; a failed pass is reported and the next tick
tries again (the stream trimmer and the dead-letter retention run on it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NoReturn

import anyio

from relay.domain.durations import SECOND


async def tick_forever(
    tick: Callable[[], Awaitable[object]],
    *,
    first_after_ns: int,
    every_ns: int,
    retried: tuple[type[Exception], ...],
    failed: Callable[[Exception], None],
) -> NoReturn:
    """Await ``tick`` after ``first_after_ns``, then every ``every_ns``. An error of
    the ``retried`` kinds goes to ``failed`` and waits for the next tick; any other
    propagates (a bug, not an outage)."""
    await anyio.sleep(first_after_ns / SECOND)
    while True:
        try:
            await tick()
        except retried as exc:
            failed(exc)
        await anyio.sleep(every_ns / SECOND)
