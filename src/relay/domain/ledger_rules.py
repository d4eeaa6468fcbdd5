"""The invocation ledger's rules on one message's hash: the one specification.

A message's ledger is a flat hash (``field -> text``): one marker per invocation
(``function/handler``, see :mod:`relay.domain.invocation`) and reserved ``@``
fields. Every ledger call is one atomic step over that hash; this module says
what each step does, as pure functions of the hash, the request and the ledger's
clock. The two side effects a step can have (writing a dead-letter entry,
acknowledging the message) go through :class:`LedgerEffects`.

Two implementations carry these rules out:

- the in-memory ledger of the unit tier (``tests/fakes.py``) calls these
  functions directly, so the unit tier tests the rules themselves;
- the Redis ledger runs them as Lua scripts (one round trip per step, which is
  what keeps an event at about 2.5 round trips), and
  ``tests/contract/test_ledger_rules_vs_lua.py`` runs random sequences of
  markers, tokens, clocks and calls through both and requires identical hashes,
  replies, DLQ entries and acknowledgments. The reason texts the scripts write
  are generated from the constants here (:func:`lua_constants`).

Safe to repeat: a call re-sent with the same token (a connection that broke
after the write) finds its own work done and answers as the first one did, so
a re-sent ``begin`` never burns an attempt and a re-sent ``finish`` is never
mistaken for a stale worker's.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Final, Protocol

from relay.domain.invocation import (
    EXHAUSTED_REASON,
    EXPIRED_DETAIL,
    NO_RESULT_DETAIL,
    BackingOff,
    Claim,
    Complete,
    Done,
    Exhaust,
    Exhausted,
    ExhaustNow,
    Marker,
    Ok,
    Release,
    Retry,
    Running,
    Skip,
    Terminal,
    apply_transition,
    claimed_at_field,
    decide,
    exhaustion_reason,
    expired_detail,
    format_marker,
    parse_int,
    parse_marker,
)
from relay.domain.outcome import (
    BACKOFF,
    CLAIMED,
    DONE,
    EXHAUSTED,
    RUNNING,
    AttemptReport,
    BeginRequest,
    BeginResult,
    ClaimRequest,
    ClaimStatus,
    DeadLettered,
    DeadLetterFirst,
    FinishRequest,
    KeepPending,
    MalformedRequest,
    RenewRequest,
    Settlement,
    message_outcome,
)

Hash = MutableMapping[str, str]

CLASS_FIELD: Final = "@class"
MALFORMED_FIELD: Final = "@dlq"

def error_field(field: str) -> str:
    """``@err:<field>``: the invocation's last failure. Written by every failed
    attempt: a retry keeps its error there while it backs off (``relay trace``
    shows it), and exhaustion replaces it with the DLQ reason."""
    return f"@err:{field}"


def entry_field(field: str) -> str:
    """``@dlq:<field>``: the id of the invocation's DLQ entry, once written (so a
    re-sent call can report the entry its first send wrote)."""
    return f"@dlq:{field}"


def is_invocation(field: str) -> bool:
    """Reserved fields start with ``@``; function names cannot."""
    return not field.startswith("@")


# --- reserved values that carry the token of the call that wrote them -------------


def claim_stamp(at_ms: int, token: str) -> str:
    """The ``@at:<field>`` value: when the current claim was taken, and by whom."""
    return f"{at_ms}#{token}"


def parse_claim_stamp(text: str | None) -> tuple[int | None, str | None]:
    """``(claimed_at_ms, token)`` of an ``@at:`` value (older values hold no token)."""
    if not text:
        return None, None
    at, _, token = text.partition("#")
    return parse_int(at), (token or None)


def class_stamp(classification: str, token: str) -> str:
    """The ``@class`` value: the once-only classification and the token that wrote it."""
    return f"{classification}#{token}"


def parse_class_stamp(text: str | None) -> tuple[str | None, str | None]:
    """``(classification, token)`` of an ``@class`` value (older values hold no token)."""
    if text is None:
        return None, None
    classification, _, token = text.partition("#")
    return classification, (token or None)


# --- effects ------------------------------------------------------------------------


class DeadLetterWriteError(Exception):
    """Writing a dead-letter entry failed; ``str()`` is the broker's message."""


class LedgerEffects(Protocol):
    """What a ledger step does beyond its hash (the broker's side)."""

    def dead_letter(self, field: str, attempt: int, reason: str) -> str:
        """Append the DLQ entry of exhausted ``field``; its id. May raise
        :class:`DeadLetterWriteError`."""
        ...

    def dead_letter_malformed(self, reason: str, event: str) -> str:
        """Append a placeholder entry (``-``/``-``); its id. May raise
        :class:`DeadLetterWriteError`."""
        ...

    def acknowledge(self) -> None:
        """XACK the message and give its hash the retention TTL."""
        ...


# --- begin --------------------------------------------------------------------------


def begin(h: Hash, request: BeginRequest, now_ms: int, effects: LedgerEffects) -> BeginResult:
    """Classify once, claim every eligible invocation, and settle when nothing was
    claimed. See :class:`relay.domain.outcome.BeginRequest`."""
    token = request.token
    previous_class = h.get(CLASS_FIELD)
    if previous_class is None:
        # An empty classification is "not known yet" (nothing to serve has loaded):
        # nothing is recorded, so a held event is never counted as unmatched.
        newly = bool(request.classification)
        if newly:
            h[CLASS_FIELD] = class_stamp(request.classification, token)
    else:
        newly = parse_class_stamp(previous_class)[1] == token  # this call, re-sent
    statuses = tuple(_claim(h, claim, token, now_ms) for claim in request.claims)
    asked = {c.field for c in request.claims} | set(request.gates) | set(request.released)
    unplanned = tuple(
        f
        for f in sorted(f for f in h if is_invocation(f) and f not in asked)
        if not isinstance(parse_marker(h[f]), Ok | Exhausted)
    )
    settlement = Settlement()
    if not any(s.status == CLAIMED for s in statuses):
        # a class not known yet keeps the message pending, whatever else it holds
        blocked = request.blocked or not request.classification
        settlement = settle(h, request.gates, request.released, blocked, effects)
    return BeginResult(
        newly_classified=newly, statuses=statuses, settlement=settlement, unplanned=unplanned
    )


def _claim(h: Hash, claim: ClaimRequest, token: str, now_ms: int) -> ClaimStatus:
    field = claim.field
    text = h.get(field)
    marker = parse_marker(text)
    if isinstance(marker, Running) and marker.token == token and now_ms < marker.deadline_ms:
        # This very call, re-sent: the claim is ours already.
        return _claimed(field, marker.attempt, marker.deadline_ms, _replaced(h, field, marker))
    match decide(marker, now_ms, claim.max_attempts):
        case Done():
            return ClaimStatus(field=field, status=DONE)
        case Terminal(attempt, _):
            return ClaimStatus(field=field, status=EXHAUSTED, attempt=attempt)
        case Skip(until_ms, running):
            assert isinstance(marker, Running | BackingOff)
            status = RUNNING if running else BACKOFF
            return ClaimStatus(
                field=field, status=status, attempt=marker.attempt, until_ms=until_ms
            )
        case ExhaustNow(attempt):
            h[field] = format_marker(Exhausted(attempt))
            h[error_field(field)] = exhaustion_reason(attempt, expired_detail(attempt))
            return ClaimStatus(field=field, status=EXHAUSTED, attempt=attempt, newly=True)
        case Claim(attempt):
            until = now_ms + claim.lease_ms
            h[field] = format_marker(Running(until, attempt, token))
            h[claimed_at_field(field)] = claim_stamp(now_ms, token)
            return _claimed(field, attempt, until, text or "")
    raise AssertionError(marker)


def _claimed(field: str, attempt: int, until_ms: int, previous: str) -> ClaimStatus:
    return ClaimStatus(
        field=field, status=CLAIMED, attempt=attempt, until_ms=until_ms, previous=previous
    )


def _replaced(h: Hash, field: str, marker: Running) -> str:
    """What a claim replaced, seen again by its re-sent call: nothing for attempt 1,
    else the previous attempt's backoff, over by the time it was claimed (equal,
    for every later decision, to whatever expired marker it was)."""
    if marker.attempt <= 1:
        return ""
    at, _ = parse_claim_stamp(h.get(claimed_at_field(field)))
    return format_marker(BackingOff(at or 0, marker.attempt - 1))


# --- finish -------------------------------------------------------------------------


def finish(h: Hash, request: FinishRequest, now_ms: int, effects: LedgerEffects) -> Settlement:
    """Apply each fenced attempt report, then settle."""
    rejected: list[str] = []
    replayed: list[DeadLettered] = []
    for report in request.reports:
        field = report.field
        current = parse_marker(h.get(field))
        after, applied = apply_transition(
            current, request.token, report.attempt, report.transition, now_ms
        )
        if applied:
            _write(h, report, after)
        elif _already_applied(h, report, request.token, current):
            entry = h.get(entry_field(field))
            if isinstance(current, Exhausted) and current.dead_lettered and entry:
                reason = h.get(error_field(field), "")
                replayed.append(DeadLettered(field=field, attempt=current.attempt,
                                             entry_id=entry, reason=reason))
        else:
            rejected.append(field)
    settled = settle(h, request.gates, request.released, request.blocked, effects)
    return Settlement(
        acknowledged=settled.acknowledged,
        dead_lettered=tuple(replayed) + settled.dead_lettered,
        dlq_error=settled.dlq_error,
        rejected=tuple(rejected),
    )


def _write(h: Hash, report: AttemptReport, after: Marker | None) -> None:
    field, transition = report.field, report.transition
    if isinstance(transition, Release):
        # Never ran: the replaced marker comes back as it was, and no claim time.
        if transition.previous:
            h[field] = transition.previous
        else:
            h.pop(field, None)
        h.pop(claimed_at_field(field), None)
        return
    assert after is not None
    h[field] = format_marker(after)
    if isinstance(transition, Exhaust | Retry):
        h[error_field(field)] = report.error


def _already_applied(h: Hash, report: AttemptReport, token: str, current: Marker | None) -> bool:
    """Whether ``report`` was applied by an earlier send of this same call: the
    latest claim is still ``token``'s and the marker is what the report made."""
    transition = report.transition
    if isinstance(transition, Release):
        # A release drops the claim's stamp; what it leaves is the replaced marker.
        return (
            h.get(claimed_at_field(report.field)) is None
            and h.get(report.field, "") == transition.previous
        )
    if parse_claim_stamp(h.get(claimed_at_field(report.field)))[1] != token:
        return False
    match transition:
        case Complete():
            return isinstance(current, Ok)
        case Retry():
            return isinstance(current, BackingOff) and current.attempt == report.attempt
        case Exhaust():
            return (
                isinstance(current, Exhausted)
                and current.attempt == report.attempt
                and h.get(error_field(report.field)) == report.error
            )
    return False


# --- renew --------------------------------------------------------------------------


def renew(h: Hash, request: RenewRequest, now_ms: int) -> int:
    """Extend a held claim to ``now + lease_ms``; the new deadline, or 0 when the
    claim is no longer this token's (expired and taken over, or finished)."""
    marker = parse_marker(h.get(request.field))
    if not (
        isinstance(marker, Running)
        and marker.token == request.token
        and marker.attempt == request.attempt
    ):
        return 0
    until = max(marker.deadline_ms, now_ms + request.lease_ms)
    h[request.field] = format_marker(Running(until, marker.attempt, marker.token))
    return until


# --- settle -------------------------------------------------------------------------


def settle(
    h: Hash,
    gates: Sequence[str],
    released: Sequence[str],
    blocked: bool,
    effects: LedgerEffects,
) -> Settlement:
    """Acknowledge the message if every invocation that gates it is terminal,
    writing the missing DLQ entries first (each with its ``:dlq`` marker).

    What gates: the invocations the current rules match (``gates``) and every
    invocation the hash records, except those whose function or rule was
    deliberately removed (``released``). An exhausted invocation is always
    dead-lettered before the acknowledgment, released or not.
    """
    gated = set(gates)
    order = list(dict.fromkeys(gates)) + sorted(f for f in h if is_invocation(f) and f not in gated)
    outcome = message_outcome(
        {f: parse_marker(h.get(f)) for f in order}, blocked=blocked, released=set(released) - gated
    )
    if isinstance(outcome, KeepPending):
        return Settlement()
    missing = outcome.fields if isinstance(outcome, DeadLetterFirst) else ()
    written: list[DeadLettered] = []
    for field in missing:
        marker = parse_marker(h.get(field))
        assert isinstance(marker, Exhausted)
        attempt = marker.attempt
        reason = h.get(error_field(field)) or exhaustion_reason(attempt, "")
        try:
            entry_id = effects.dead_letter(field, attempt, reason)
        except DeadLetterWriteError as exc:
            return Settlement(dead_lettered=tuple(written), dlq_error=str(exc))
        h[field] = format_marker(Exhausted(attempt, dead_lettered=True))
        h[entry_field(field)] = entry_id
        written.append(DeadLettered(field=field, attempt=attempt, entry_id=entry_id, reason=reason))
    effects.acknowledge()
    return Settlement(acknowledged=True, dead_lettered=tuple(written))


# --- malformed ----------------------------------------------------------------------


def dead_letter_malformed(h: Hash, request: MalformedRequest, effects: LedgerEffects) -> Settlement:
    """One placeholder DLQ entry per message (``@dlq``), then the acknowledgment."""
    written: tuple[DeadLettered, ...] = ()
    if MALFORMED_FIELD not in h:
        try:
            entry_id = effects.dead_letter_malformed(request.reason, request.event)
        except DeadLetterWriteError as exc:
            return Settlement(dlq_error=str(exc))
        h[MALFORMED_FIELD] = entry_id
        written = (DeadLettered(field="-", attempt=0, entry_id=entry_id, reason=request.reason),)
    effects.acknowledge()
    return Settlement(acknowledged=True, dead_lettered=written)


# --- the constants the Lua scripts are generated with -------------------------------


def lua_constants() -> dict[str, str]:
    """Lua source of every reason text and reserved name the scripts use, so they
    are defined once, here (the Redis adapter prepends them at load)."""
    return {
        "EXHAUSTED_REASON": EXHAUSTED_REASON,
        "EXPIRED_DETAIL": EXPIRED_DETAIL,
        "NO_RESULT_DETAIL": NO_RESULT_DETAIL,
        "CLASS_FIELD": CLASS_FIELD,
        "MALFORMED_FIELD": MALFORMED_FIELD,
    }
