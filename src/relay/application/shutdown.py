"""Graceful shutdown: stop taking messages, let the ones in flight finish, bounded.

On the first SIGTERM/SIGINT the daemon calls :meth:`GracefulStop.drain`:

1. the consumer and recovery loops stop reading and reclaiming at once (a broker
   call already made finishes, and its messages count as in flight);
2. the messages in flight (every place held in the buffer) get ``grace_s`` to
   finish: a handler that returns in time is recorded and its message
   acknowledged as usual;
3. then the daemon cancels what is left. A dispatch cancelled before its result
   was recorded releases its claims (``MessageDispatcher``): the marker goes back
   to what it was, no attempt is charged, and the message stays pending for the
   next worker's recovery pass. A second signal during the grace ends it at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import structlog

from relay.application.buffer import MessageBuffer
from relay.application.ports import Intake

_log = structlog.get_logger(__name__)

COMPLETE = "complete"
GRACE_EXPIRED = "grace_expired"
INTERRUPTED = "interrupted"


class GracefulStop:
    """Drains one worker's in-flight messages within ``grace_s`` seconds."""

    def __init__(
        self, loops: Sequence[Intake], buffer: MessageBuffer, *, grace_s: float
    ) -> None:
        self._loops = loops
        self._buffer = buffer
        self.grace_s = grace_s

    async def drain(self, hurry: anyio.Event | None = None) -> str:
        """Stop intake and wait for the buffer to empty, at most ``grace_s`` or
        until ``hurry`` is set; returns how it ended (:data:`COMPLETE`,
        :data:`GRACE_EXPIRED` or :data:`INTERRUPTED`). Cancelling what is left is
        the caller's (the daemon cancels its task group)."""
        for loop in self._loops:
            loop.stop_reading()
        buffer = self._buffer
        _log.info("shutdown_started", in_flight=buffer.occupancy, grace_s=self.grace_s)
        ended = GRACE_EXPIRED
        async with anyio.create_task_group() as tg:

            async def emptied() -> None:
                nonlocal ended
                await buffer.wait_empty()
                ended = COMPLETE
                tg.cancel_scope.cancel()

            async def hurried() -> None:
                nonlocal ended
                if hurry is None:
                    return
                await hurry.wait()
                ended = INTERRUPTED
                tg.cancel_scope.cancel()

            tg.cancel_scope.deadline = anyio.current_time() + self.grace_s
            tg.start_soon(emptied)
            tg.start_soon(hurried)
        if ended == COMPLETE:
            _log.info("shutdown_complete")
        else:
            # What is cancelled now releases its claims: no attempt is charged.
            event = "shutdown_grace_expired" if ended == GRACE_EXPIRED else "shutdown_interrupted"
            _log.warning(event, in_flight=buffer.occupancy, grace_s=self.grace_s)
        return ended
