"""The per-function circuit breaker: a pure state machine on an injected clock.

``closed``: every invocation runs; a failed attempt is counted, a success resets
the count. ``failures`` consecutive failed attempts whose first is no older than
``window`` open the breaker. ``open``: nothing runs until ``cooldown`` has
passed; then the next invocation asked for is the one *probe* and the breaker is
``half_open``: nothing else runs until that probe's result is known. A probe that
succeeds closes the breaker (cooldown back to its base); one that fails re-opens
it with the cooldown doubled, up to ``max_cooldown``. A probe that never produced
a result (released, fenced, its result lost) gives its turn to the next
invocation asked for.

An operator can force a breaker open (it then stays open, with no probe, until
forced closed) or closed (everything forgotten). Results of invocations admitted
before the breaker left ``closed`` are ignored once it has: only the probe decides.

Times are seconds on a monotonic clock, passed in by the caller.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from relay.domain.durations import MINUTE, SECOND

State = Literal["closed", "open", "half_open"]
CLOSED: Final = "closed"
OPEN: Final = "open"
HALF_OPEN: Final = "half_open"
# The ``function_breaker_state`` gauge's values.
STATE_VALUES: Final[dict[str, int]] = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}

DEFAULT_FAILURES: Final = 5
DEFAULT_WINDOW_NS: Final = MINUTE
DEFAULT_COOLDOWN_NS: Final = 30 * SECOND
DEFAULT_MAX_COOLDOWN_NS: Final = 10 * MINUTE


class BreakerPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """A template's ``breaker`` settings (durations in nanoseconds)."""

    failures: int = DEFAULT_FAILURES
    window_ns: int = DEFAULT_WINDOW_NS
    cooldown_ns: int = DEFAULT_COOLDOWN_NS
    max_cooldown_ns: int = DEFAULT_MAX_COOLDOWN_NS


class BreakerState(msgspec.Struct, frozen=True, kw_only=True):
    """One function's breaker on one worker."""

    state: State = CLOSED
    failures: tuple[float, ...] = ()  # consecutive failure times (closed only)
    opened_at: float = 0.0
    cooldown_s: float = 0.0  # the current cooldown (open / half-open)
    probe: str = ""  # the key of the probe in flight (half-open)
    forced: bool = False  # opened by an operator: no probe until forced closed

    def retry_at(self) -> float | None:
        """When an open (not forced) breaker lets its probe through."""
        if self.state != OPEN or self.forced:
            return None
        return self.opened_at + self.cooldown_s


class BreakerChange(msgspec.Struct, frozen=True, kw_only=True):
    """A transition: the state it went to and why (``failures``, ``cooldown``,
    ``probe_succeeded``, ``probe_failed``, ``forced``, ``disabled``)."""

    state: State
    cause: str
    cooldown_s: float = 0.0
    failures: int = 0


Admission = Literal["run", "probe", "hold"]


def admit(  # noqa: PLR0911 - one return per case of the state machine reads best
    current: BreakerState, policy: BreakerPolicy | None, now: float, key: str
) -> tuple[Admission, BreakerState, BreakerChange | None]:
    """May invocation ``key`` run now? ``probe`` means it is the half-open probe."""
    if current.forced:
        return "hold", current, None
    if policy is None:
        # No breaker in the template (or removed on a reload): nothing is held.
        if current.state == CLOSED:
            return "run", current, None
        return "run", BreakerState(), BreakerChange(state=CLOSED, cause="disabled")
    if current.state == CLOSED:
        return "run", current, None
    if current.state == HALF_OPEN:
        if not current.probe:  # the last probe gave no result: this one probes
            return "probe", msgspec.structs.replace(current, probe=key), None
        return ("probe" if current.probe == key else "hold"), current, None
    if now < current.opened_at + current.cooldown_s:
        return "hold", current, None
    probing = msgspec.structs.replace(current, state=HALF_OPEN, probe=key)
    return "probe", probing, BreakerChange(
        state=HALF_OPEN, cause="cooldown", cooldown_s=current.cooldown_s
    )


def record(  # noqa: PLR0911 - one return per case of the state machine reads best
    current: BreakerState,
    policy: BreakerPolicy | None,
    now: float,
    key: str,
    ok: bool | None,
) -> tuple[BreakerState, BreakerChange | None]:
    """The result of invocation ``key``: ``True`` succeeded, ``False`` failed (a
    timeout included), ``None`` produced no result that counts (released, fenced)."""
    if policy is None or current.forced:
        return current, None
    if current.state == HALF_OPEN:
        if key != current.probe:
            return current, None  # admitted before the breaker opened: only the probe decides
        if ok is None:
            return msgspec.structs.replace(current, probe=""), None  # the next one probes
        if ok:
            return BreakerState(), BreakerChange(state=CLOSED, cause="probe_succeeded")
        cooldown = min(current.cooldown_s * 2, policy.max_cooldown_ns / 1e9)
        return _opened(now, cooldown, "probe_failed", 1)
    if current.state == OPEN or ok is None:
        return current, None
    if ok:
        return (BreakerState() if current.failures else current), None
    window_s = policy.window_ns / 1e9
    recent = (*(t for t in current.failures if now - t <= window_s), now)
    if len(recent) < policy.failures:
        return msgspec.structs.replace(current, failures=recent), None
    return _opened(now, policy.cooldown_ns / 1e9, "failures", len(recent))


def force(
    current: BreakerState, policy: BreakerPolicy | None, now: float, *, open_: bool
) -> tuple[BreakerState, BreakerChange | None]:
    """An operator's ``relay function breaker open|close``."""
    if open_:
        if current.forced:
            return current, None
        cooldown = (policy or BreakerPolicy()).cooldown_ns / 1e9
        state = BreakerState(state=OPEN, opened_at=now, cooldown_s=cooldown, forced=True)
        return state, BreakerChange(state=OPEN, cause="forced")
    if current.state == CLOSED and not current.forced:
        return BreakerState(), None
    return BreakerState(), BreakerChange(state=CLOSED, cause="forced")


def _opened(
    now: float, cooldown_s: float, cause: str, failures: int
) -> tuple[BreakerState, BreakerChange]:
    state = BreakerState(state=OPEN, opened_at=now, cooldown_s=cooldown_s)
    change = BreakerChange(state=OPEN, cause=cause, cooldown_s=cooldown_s, failures=failures)
    return state, change
