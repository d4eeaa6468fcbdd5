"""Invocation state: the per-handler marker of one message, and its state machine.

Every matched invocation of a message (identity ``<function>/<handler>``) has one
marker in the message's ledger hash. The encoding extends the spec's with a random
fencing token on the running marker (LESSONS, "Fenced markers"); deadlines are
integer milliseconds on the Redis server clock:

======================================  =============================================
``ok``                                  completed; every redelivery skips it
``running:<deadline_ms>#<n>#<token>``   attempt ``n`` (1-based) was claimed with
                                        ``token``; protected while ``now < deadline``
``next_attempt_at:<deadline_ms>#<n>``   attempt ``n`` failed; protected while
                                        ``now < deadline`` (the retry backoff)
``exhausted:<n>``                       terminal; its dead-letter entry is not written
``exhausted:<n>:dlq``                   terminal; its dead-letter entry is written
absent or unparsable                    eligible, as attempt 1
======================================  =============================================

Reserved message-level fields start with ``@`` (function names cannot): ``@class``
(the once-only classification), ``@dlq`` (a malformed message's entry id),
``@err:<field>`` (an exhausted invocation's DLQ reason), ``@dlq:<field>`` (the id of
its DLQ entry) and ``@at:<field>`` (when its current or last attempt was claimed, and
by which token, see :func:`claimed_at_field`).

The attempt is counted at claim: an expired ``running`` marker (a crashed or
killed worker) counts as a spent attempt, so a handler that crashes its container
still reaches the dead-letter queue. What each ledger call does with these markers is
:mod:`relay.domain.ledger_rules`; the Lua scripts in ``relay/adapters/redis/lua`` are
proven equal to it by a property test.
"""

from __future__ import annotations

from typing import Final

import msgspec

from relay.domain.durations import HOUR, SECOND

# Retry backoff after attempt 1, 2, 3, then capped (spec: 1m, 2m, 5m, 10m).
BACKOFF_MS: Final = (60_000, 120_000, 300_000, 600_000)
DEFAULT_RETRIES: Final = 4

# How long an acknowledged message's ledger hash is kept (``LEDGER_RETENTION``):
# ``relay trace`` can still explain it, and a copy that begins after the XACK finds
# its invocations done. Never under an hour, the window such a copy needs.
LEDGER_RETENTION_NS: Final = 48 * HOUR
MIN_LEDGER_RETENTION_NS: Final = HOUR
LEDGER_RETENTION_S: Final = LEDGER_RETENTION_NS // SECOND


# The reason texts of exhaustion, written once. ``%d``/``%s`` so the Lua scripts
# format them the same way (``string.format``; see ``ledger_rules.lua_constants``).
EXHAUSTED_REASON: Final = "retries exhausted after %d attempt(s): %s"
EXPIRED_DETAIL: Final = "attempt %d did not finish before its deadline"
NO_RESULT_DETAIL: Final = "no result recorded"


def exhaustion_reason(attempt: int, error: str) -> str:
    """The DLQ ``reason`` of an invocation exhausted at ``attempt``."""
    return EXHAUSTED_REASON % (attempt, error or NO_RESULT_DETAIL)


def expired_detail(attempt: int) -> str:
    """Why an invocation whose last attempt expired unfinished is exhausted."""
    return EXPIRED_DETAIL % attempt


def backoff_ms(attempt: int) -> int:
    """How long a failed ``attempt`` (1-based) waits before the next one."""
    if attempt < 1:
        return BACKOFF_MS[0]
    return BACKOFF_MS[min(attempt, len(BACKOFF_MS)) - 1]


def invocation_field(function: str, handler: str) -> str:
    """The ledger hash field naming one invocation: ``<function>/<handler>``."""
    return f"{function}/{handler}"


def claimed_at_field(field: str) -> str:
    """The reserved ledger field holding when ``field``'s current (or last) attempt
    was claimed, and by whom: ``@at:<function>/<handler>`` = ``<ms>#<token>``
    (server time in integer ms; see ``ledger_rules.parse_claim_stamp``).

    Written by the claim together with its ``running`` marker and removed when the
    claim is released unrun; like every ``@`` field it is never an invocation.
    """
    return f"@at:{field}"


# --- markers -------------------------------------------------------------------


class Ok(msgspec.Struct, frozen=True):
    """The invocation completed."""


class Running(msgspec.Struct, frozen=True):
    """Attempt ``attempt`` is claimed by ``token`` until ``deadline_ms``."""

    deadline_ms: int
    attempt: int
    token: str


class BackingOff(msgspec.Struct, frozen=True):
    """Attempt ``attempt`` failed; the next one waits until ``deadline_ms``."""

    deadline_ms: int
    attempt: int


class Exhausted(msgspec.Struct, frozen=True):
    """Terminal after ``attempt`` attempts; ``dead_lettered`` once its entry is written."""

    attempt: int
    dead_lettered: bool = False


Marker = Ok | Running | BackingOff | Exhausted


# The longest number a marker may hold: 15 ASCII digits, exact in a double, so the
# Lua scripts (whose numbers are doubles) read every marker as this module does.
MAX_DIGITS: Final = 15


def parse_int(text: str) -> int | None:
    """A marker's number: ASCII digits only, at most :data:`MAX_DIGITS` of them."""
    if text and len(text) <= MAX_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None


_int = parse_int


def _deadline_attempt(rest: str) -> tuple[int, int, list[str]] | None:
    parts = rest.split("#")
    if len(parts) < 2:
        return None
    deadline, attempt = _int(parts[0]), _int(parts[1])
    if deadline is None or attempt is None or attempt < 1:
        return None
    return deadline, attempt, parts[2:]


def parse_marker(text: str | None) -> Marker | None:  # noqa: PLR0911 - one return per marker kind
    """The marker encoded in ``text``; ``None`` when absent or unparsable (eligible)."""
    if not text:
        return None
    if text == "ok":
        return Ok()
    kind, _, rest = text.partition(":")
    if kind == "exhausted":  # exactly ``exhausted:<n>`` or ``exhausted:<n>:dlq``
        count, colon, suffix = rest.partition(":")
        attempt = _int(count)
        if attempt is None or (colon and suffix != "dlq"):
            return None
        return Exhausted(attempt, dead_lettered=bool(colon))
    parsed = _deadline_attempt(rest)
    if parsed is None:
        return None
    deadline, attempt, extra = parsed
    if kind == "running" and len(extra) == 1 and extra[0]:
        return Running(deadline, attempt, extra[0])
    if kind == "next_attempt_at" and not extra:
        return BackingOff(deadline, attempt)
    return None


def format_marker(marker: Marker) -> str:
    """The ledger text of ``marker`` (inverse of :func:`parse_marker`)."""
    match marker:
        case Ok():
            return "ok"
        case Running(deadline_ms, attempt, token):
            return f"running:{deadline_ms}#{attempt}#{token}"
        case BackingOff(deadline_ms, attempt):
            return f"next_attempt_at:{deadline_ms}#{attempt}"
        case Exhausted(attempt, dead_lettered):
            return f"exhausted:{attempt}:dlq" if dead_lettered else f"exhausted:{attempt}"


# --- what a delivery may do with one invocation ---------------------------------


class Claim(msgspec.Struct, frozen=True):
    """Eligible: claim it as attempt ``attempt``."""

    attempt: int


class Skip(msgspec.Struct, frozen=True):
    """Protected by a live claim or a backoff until ``until_ms``; leave it alone."""

    until_ms: int
    running: bool


class Done(msgspec.Struct, frozen=True):
    """Completed earlier."""


class Terminal(msgspec.Struct, frozen=True):
    """Exhausted (``dead_lettered`` once its entry is written)."""

    attempt: int
    dead_lettered: bool


class ExhaustNow(msgspec.Struct, frozen=True):
    """The last attempt ``attempt`` expired without a result (its worker died):
    exhausted without running again."""

    attempt: int


Decision = Claim | Skip | Done | Terminal | ExhaustNow


def decide(marker: Marker | None, now_ms: int, max_attempts: int) -> Decision:
    """What a delivery at ``now_ms`` does with an invocation in state ``marker``.

    ``max_attempts`` is ``1 + retries`` of the rule as it is now, so lowering
    ``retries`` in a template exhausts an invocation already past the new bound.
    """
    match marker:
        case None:
            return Claim(1)
        case Ok():
            return Done()
        case Exhausted(attempt, dead_lettered):
            return Terminal(attempt, dead_lettered)
        case Running(deadline_ms, attempt, _) | BackingOff(deadline_ms, attempt):
            if now_ms < deadline_ms:
                return Skip(deadline_ms, running=isinstance(marker, Running))
            if attempt >= max(1, max_attempts):
                return ExhaustNow(attempt)
            return Claim(attempt + 1)


# --- what an attempt's result writes ---------------------------------------------


class Complete(msgspec.Struct, frozen=True, tag="ok"):
    """The attempt succeeded: write ``ok``."""


class Retry(msgspec.Struct, frozen=True, tag="retry"):
    """The attempt failed with attempts left: back off ``backoff_ms``."""

    backoff_ms: int


class Exhaust(msgspec.Struct, frozen=True, tag="exhaust"):
    """The attempt failed and was the last one: exhausted."""


class Release(msgspec.Struct, frozen=True, tag="release"):
    """The claim was never run (no concurrency slot, shutdown): restore the marker
    the claim replaced, so no attempt is charged."""

    previous: str


Transition = Complete | Retry | Exhaust | Release


def after_failure(attempt: int, max_attempts: int) -> Retry | Exhaust:
    """The transition of a failed ``attempt`` under a ``1 + retries`` bound."""
    if attempt >= max_attempts:
        return Exhaust()
    return Retry(backoff_ms(attempt))


def apply_transition(
    current: Marker | None, token: str, attempt: int, transition: Transition, now_ms: int
) -> tuple[Marker | None, bool]:
    """The marker after ``transition``, and whether it was applied.

    Fenced: only the holder of the running claim (same ``attempt`` and ``token``)
    may move it on; anyone else's late result is rejected and changes nothing.
    A released claim restores ``Release.previous`` (``None`` when it was absent).
    """
    if not (isinstance(current, Running) and current.token == token and current.attempt == attempt):
        return current, False
    match transition:
        case Complete():
            return Ok(), True
        case Retry(backoff):
            return BackingOff(now_ms + backoff, attempt), True
        case Exhaust():
            return Exhausted(attempt), True
        case Release(previous):
            return parse_marker(previous), True
