"""The execution vocabulary shared by the runtime port and its adapters.

An :class:`InvocationRequest` is one handler run; an :class:`InvocationResult`
says how it ended. A :class:`PoolSnapshot` is the live view of one function's
warm container pool (the gauges ``relay function inspect`` shows).
"""

from __future__ import annotations

from typing import Final

import msgspec

from relay.domain.errors import RelayError
from relay.domain.handler_context import HandlerContext

# Why a container was discarded instead of returned to the warm pool. A closed
# set: these are the only values of the ``reason`` metric label.
DISCARD_TIMEOUT: Final = "timeout"
DISCARD_PROCESS_EXIT: Final = "process_exit"
DISCARD_PROTOCOL_ERROR: Final = "protocol_error"
DISCARD_IMAGE_CHANGED: Final = "image_changed"
DISCARD_IDLE_TIMEOUT: Final = "idle_timeout"
DISCARD_CONCURRENCY_SHRINK: Final = "concurrency_shrink"
DISCARD_SHUTDOWN: Final = "shutdown"
# The worker-global bound on warm containers made room for another function's
# cold start by retiring the least recently used idle container (LESSONS.md).
DISCARD_EVICTED: Final = "evicted"
# Removal-time discards are tombstoned: reported to nobody (no metric series).
DISCARD_FUNCTION_REMOVED: Final = "function_removed"
DISCARD_REASONS: Final = frozenset(
    {
        DISCARD_TIMEOUT,
        DISCARD_PROCESS_EXIT,
        DISCARD_PROTOCOL_ERROR,
        DISCARD_IMAGE_CHANGED,
        DISCARD_IDLE_TIMEOUT,
        DISCARD_CONCURRENCY_SHRINK,
        DISCARD_SHUTDOWN,
        DISCARD_EVICTED,
    }
)

ACQUIRE_WARM: Final = "warm"
ACQUIRE_COLD: Final = "cold"

# The most of a handler's return value (its JSON text, ASCII: escapes for the
# rest) an answer carries; past it the bootstrap sends the first this many bytes
# and the full size. 16 KiB, so an answer frame stays far below the 64 KiB a
# frame or the socket may hold even when every byte is escaped once more. Both
# bootstraps repeat it (stdlib-only files); a unit test checks they agree.
RESULT_MAX_BYTES: Final = 16 * 1024
# The most output a captured invocation keeps (``capture_output``); later lines
# are counted, not kept: the worker's memory stays bounded whatever a handler prints.
OUTPUT_CAPTURE_MAX_BYTES: Final = 256 * 1024

# Timeouts: rule default and hard cap (a rule's timeout is clamped to the cap).
DEFAULT_TIMEOUT_NS: Final = 6_000_000_000
MAX_TIMEOUT_NS: Final = 300_000_000_000


class SlotUnavailable(RelayError):
    """No concurrency slot within the bounded wait: leave the message pending
    for a later redelivery, and never charge an attempt for it."""


class LeaseLost(RelayError):
    """The claim's lease could not be made to cover the handler's timeout before
    it started (``reason``: ``lease_lost`` when another worker holds it now,
    ``lease_unrenewable`` when the ledger could not be reached): the handler does
    not run, and no attempt is charged for it."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class SecretNotFound(RelayError):
    """A secret reference names a secret that is not in the store."""


class RuntimeUnavailable(RelayError):
    """The container runtime cannot serve a function (removed, closed, or the
    engine refused to start a container)."""


class InvocationRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One handler run inside the function's warm container.

    ``event`` is the event's JSON text. ``env`` is the full per-invocation
    environment (template env plus resolved secrets; the runtime adds
    ``RELAY_HANDLER`` and ``RELAY_DEADLINE``). ``context`` is the message or
    event id used to prefix forwarded output lines; it may be empty.
    ``handler_context`` becomes the handler's other ``RELAY_*`` variables
    (:mod:`relay.domain.handler_context`).
    """

    function: str
    handler: str
    event: bytes
    env: dict[str, str] = msgspec.field(default_factory=dict)
    timeout_ns: int = DEFAULT_TIMEOUT_NS
    context: str = ""
    handler_context: HandlerContext | None = None
    # keep the handler's output lines and its return value in the result
    # (``relay function invoke``/``run`` show them; the lines are still forwarded
    # as usual). Delivery never asks: the bootstrap then does not encode the value.
    capture_output: bool = False


class InvocationResult(msgspec.Struct, frozen=True, kw_only=True):
    """How one invocation ended.

    ``error`` is empty on success and otherwise one line naming the function and
    handler. ``exit_code`` is the container's exit code when its process ended
    (a timeout or a crash), else ``None``. ``discarded`` is the discard reason
    when the container was thrown away instead of returned to the pool.

    ``result`` is the handler's return value as JSON text (``None``: it returned
    nothing, ``None``/``null``/``undefined``, or failed), at most
    ``RESULT_MAX_BYTES``; ``result_size`` is the full text's size, larger than
    ``len(result)`` when the bootstrap truncated it. ``output`` holds the
    handler's output lines when the request asked for them (``capture_output``),
    at most ``OUTPUT_CAPTURE_MAX_BYTES``; ``output_dropped`` counts the lines
    past that bound. ``image`` is the image the container ran.
    """

    ok: bool
    error: str = ""
    exit_code: int | None = None
    duration_s: float = 0.0
    discarded: str | None = None
    result: str | None = None
    result_size: int = 0
    output: tuple[str, ...] = ()
    output_dropped: int = 0
    image: str = ""


class PoolSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """Live gauges plus cumulative counters of one function's warm pool."""

    capacity: int
    containers: int
    busy: int
    idle: int
    starting: int
    warm_acquires: int
    cold_starts: int
    discarded: int


def clamp_timeout_ns(timeout_ns: int) -> int:
    """A rule timeout bounded to (0, 5m]; non-positive means the default."""
    if timeout_ns <= 0:
        return DEFAULT_TIMEOUT_NS
    return min(timeout_ns, MAX_TIMEOUT_NS)


def crashed(exc: BaseException) -> str:
    """The error text of an attempt that failed on an unexpected exception: its type
    alone. Its message and repr stay out of error texts, which reach the ledger, the
    DLQ and the logs: they can hold what the failing code was given (a secret's
    bytes). The traceback is logged beside it for whoever debugs Relay."""
    return f"internal error ({type(exc).__name__}); see the worker log"


def failure_message(function: str, handler: str, detail: str) -> str:
    """The one-line error of a failed invocation, naming function and handler."""
    return f'function "{function}" handler "{handler}": {detail}'


class CapturedOutput:
    """A captured invocation's output lines: kept up to ``max_bytes`` (UTF-8, a
    newline each), then only counted, so what a handler prints never grows memory."""

    __slots__ = ("_room", "dropped", "lines")

    def __init__(self, max_bytes: int = OUTPUT_CAPTURE_MAX_BYTES) -> None:
        self.lines: list[str] = []
        self.dropped = 0
        self._room = max_bytes

    def add(self, line: str) -> None:
        size = len(line.encode("utf-8", errors="replace")) + 1
        if self.dropped or size > self._room:
            self.dropped += 1  # once full, later lines never slip in out of order
            return
        self._room -= size
        self.lines.append(line)
