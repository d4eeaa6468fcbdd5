"""Message outcome: acknowledge, keep pending, or dead-letter first.

A message is acknowledged only when every invocation that gates it is ``ok`` or
exhausted with its dead-letter entry written. Unmatched events are acknowledged;
an event matching a function whose image is still building stays pending. A
payload that can never succeed (no ``event`` field, not UTF-8, not a JSON object,
larger than ``MAX_EVENT_BYTES``) is dead-lettered at once under ``-`` placeholders.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from relay.domain.dlq_event import MISSING_EVENT, OVERSIZED, SUMMARY_BYTES, dlq_event_text
from relay.domain.invocation import Exhausted, Marker, Ok, Transition

PLACEHOLDER: Final = "-"

# DLQ entry fields, in the order they are written (the spec's flat format).
DLQ_FIELDS: Final = (
    "original_stream",
    "original_id",
    "group",
    "consumer",
    "event",
    "reason",
    "function",
    "handler",
    "deliveries",
    "handler_attempts",
    "timestamp",
)


class Acknowledge(msgspec.Struct, frozen=True):
    """Every gating invocation is done: XACK."""


class KeepPending(msgspec.Struct, frozen=True):
    """Something is unresolved (retrying, running elsewhere, building): no XACK."""


class DeadLetterFirst(msgspec.Struct, frozen=True):
    """All terminal, some exhausted: write the entries of ``fields`` (those not
    yet written), then XACK."""

    fields: tuple[str, ...]


MessageOutcome = Acknowledge | KeepPending | DeadLetterFirst


def message_outcome(
    gates: Mapping[str, Marker | None],
    *,
    blocked: bool,
    released: AbstractSet[str] = frozenset(),
) -> MessageOutcome:
    """The outcome of a message whose gating invocations are in state ``gates``.

    ``blocked`` is true when a function the message needs has no image yet (or is
    unavailable): the message waits for it, without an attempt charged and
    without being acknowledged. A ``released`` invocation (its function or rule
    deliberately removed) no longer gates unless it is exhausted: an exhausted
    invocation is always dead-lettered before the acknowledgment.
    """
    if blocked:
        return KeepPending()
    missing: list[str] = []
    for field, marker in gates.items():
        if isinstance(marker, Ok):
            continue
        if isinstance(marker, Exhausted):
            if not marker.dead_lettered:
                missing.append(field)
            continue
        if field not in released:
            return KeepPending()
    return DeadLetterFirst(tuple(missing)) if missing else Acknowledge()


# --- payloads ----------------------------------------------------------------------


class Malformed(msgspec.Struct, frozen=True):
    """A payload that can never succeed, with a short reason and the DLQ entry's
    ``event`` text (:func:`dlq_event_text`: the whole payload when it is within
    ``MAX_EVENT_BYTES``; an oversized payload only summarised, never stored)."""

    reason: str
    summary: str


def _oversized(raw: bytes, max_bytes: int) -> Malformed:
    head = raw[:SUMMARY_BYTES].decode("utf-8", "replace")
    return Malformed(
        f"event is {len(raw)} bytes, {OVERSIZED} ({max_bytes})",
        f"{head}... ({len(raw)} bytes, truncated)",
    )


_decoder = msgspec.json.Decoder()


def inspect_payload(raw: bytes | None, max_bytes: int) -> dict[str, Any] | Malformed:
    """The decoded event object, or why the message must be dead-lettered at once.

    The size cap is checked before decoding, so a huge payload costs no parsing.
    """
    if raw is None:
        return Malformed(MISSING_EVENT, "")
    if len(raw) > max_bytes:
        return _oversized(raw, max_bytes)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return Malformed("event is not a UTF-8 string", dlq_event_text(raw))
    try:
        value = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        return Malformed(f"event is not valid JSON: {exc}", dlq_event_text(raw))
    if not isinstance(value, dict):
        return Malformed(
            f"event is a JSON {type(value).__name__}, not an object", dlq_event_text(raw)
        )
    return value


def malformed(reason: str, raw: bytes, max_bytes: int) -> Malformed:
    """A payload found malformed after decoding (an occurrence Relay did not write,
    ...): the entry keeps it whole, or summarised when oversized."""
    if len(raw) > max_bytes:
        return Malformed(reason, _oversized(raw, max_bytes).summary)
    return Malformed(reason, dlq_event_text(raw))


def classify_failure(exc: BaseException, raw: bytes, max_bytes: int) -> Malformed:
    """An event whose decoding or matching raised (nested too deep for the
    decoder or the matcher, or anything unforeseen): it can never succeed either.
    Only the exception's type is named: its text may quote the payload."""
    kind = "nested too deeply" if isinstance(exc, RecursionError) else type(exc).__name__
    return malformed(f"event could not be decoded or classified: {kind}", raw, max_bytes)


# --- dead-letter entries -------------------------------------------------------------


_second: list[tuple[int, str]] = [(-1, "")]


def rfc3339(epoch_s: float) -> str:
    """``epoch_s`` as an RFC 3339 UTC timestamp with milliseconds.

    On the hot path (every ledger call carries one), so the formatted second is
    cached and only the milliseconds are formatted each time."""
    whole = int(epoch_s)
    cached_second, prefix = _second[0]
    if whole != cached_second:
        prefix = datetime.fromtimestamp(whole, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        _second[0] = (whole, prefix)
    return f"{prefix}{int((epoch_s - whole) * 1000):03d}Z"


class DeadLetterEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One flat entry of ``relay:<stream>:dlq`` (the spec's format)."""

    original_stream: str
    original_id: str
    group: str
    consumer: str
    event: str
    reason: str
    function: str = PLACEHOLDER
    handler: str = PLACEHOLDER
    deliveries: int = 1
    handler_attempts: int = 0
    timestamp: str = ""

    def fields(self) -> dict[str, str]:
        """The entry as the stream's flat string fields, in the spec's order."""
        return {name: str(getattr(self, name)) for name in DLQ_FIELDS}

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> DeadLetterEntry:
        """Parse an entry read back from the stream (unknown fields ignored)."""
        values: dict[str, Any] = {k: fields.get(k, "") for k in DLQ_FIELDS}
        values["deliveries"] = _to_int(values["deliveries"])
        values["handler_attempts"] = _to_int(values["handler_attempts"])
        return cls(**values)


def _to_int(text: str) -> int:
    return int(text) if text.isdigit() else 0


def unique_in_order(items: Iterable[str]) -> tuple[str, ...]:
    """``items`` without repeats, first occurrence kept."""
    return tuple(dict.fromkeys(items))


# --- the stream and ledger vocabulary (ports: EventStream, InvocationLedger) ---------


class StreamMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One delivered stream entry. ``payload`` is the raw ``event`` field (``None``
    when the field is missing); ``deliveries`` is the broker's delivery count
    (diagnostic only); ``reclaimed`` marks a recovery-loop delivery (or any
    delivery after the first); ``delivery`` is the broker's opaque handle of this
    delivery (the embedded broker's lease token; empty on Redis), carried to the
    ledger on :attr:`MessageContext.delivery`."""

    id: str
    payload: bytes | None
    deliveries: int = 1
    reclaimed: bool = False
    delivery: str = ""
    traceparent: str = ""  # the entry's valid W3C ``traceparent`` field, or ""


class Reclaimed(msgspec.Struct, frozen=True, kw_only=True):
    """One recovery step: messages taken over, and ids whose body is gone."""

    messages: tuple[StreamMessage, ...] = ()
    deleted: tuple[str, ...] = ()
    complete: bool = True  # the scan reached the end of the pending list


class MessageContext(msgspec.Struct, frozen=True, kw_only=True):
    """Which message a ledger call is about, and what its DLQ entries carry."""

    stream: str
    group: str
    consumer: str
    message_id: str
    timestamp: str  # RFC 3339, stamped on any DLQ entry written by the call
    delivery: str = ""  # the broker's handle of this delivery (StreamMessage.delivery)
    traceparent: str = ""  # the producer's (StreamMessage.traceparent)


class ClaimRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Claim ``field`` (``function/handler``) if eligible, protected for ``lease_ms``."""

    field: str
    max_attempts: int
    lease_ms: int


class BeginRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Classify + claim + (when nothing is claimed) settle, as one atomic step.

    ``classification`` is recorded once per message (``matched:<f1>,<f2>`` or
    ``unmatched``; empty means not known yet and records nothing: no catalog has
    loaded, or a template that might match cannot be read); ``gates`` are the
    invocation fields the current rules say must be terminal before the ACK;
    every invocation the ledger already records gates too, except ``released``
    ones (their function or rule was deliberately removed from a valid catalog);
    ``blocked`` keeps the message pending (a function it needs is building or
    unavailable, or the class is not known yet)."""

    context: MessageContext
    classification: str
    token: str
    claims: tuple[ClaimRequest, ...] = ()
    gates: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    blocked: bool = False


# Status codes of one invocation in a BeginResult.
CLAIMED: Final = "claimed"
DONE: Final = "ok"
RUNNING: Final = "running"
BACKOFF: Final = "backoff"
EXHAUSTED: Final = "exhausted"


class ClaimStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What ``begin`` found or did for one requested claim.

    ``claimed``: run it as ``attempt``; ``previous`` is the marker text the claim
    replaced (restored by a release). ``running``/``backoff``: protected until
    ``until_ms``. ``ok``: done earlier. ``exhausted``: terminal; ``newly`` when
    this call exhausted it (its last attempt expired without a result)."""

    field: str
    status: str
    attempt: int = 0
    until_ms: int = 0
    previous: str = ""
    newly: bool = False


class DeadLettered(msgspec.Struct, frozen=True, kw_only=True):
    """One DLQ entry a ledger call wrote."""

    field: str  # "-" for a placeholder (malformed) entry
    attempt: int
    entry_id: str
    reason: str


class Settlement(msgspec.Struct, frozen=True, kw_only=True):
    """How a ledger call left the message.

    ``acknowledged``: XACKed (and its ledger given a TTL). ``dead_lettered``:
    entries written by this call. ``dlq_error``: the DLQ write failed, so the
    message stays pending. ``rejected``: fields whose fenced report was refused
    (the claim was lost to a newer attempt)."""

    acknowledged: bool = False
    dead_lettered: tuple[DeadLettered, ...] = ()
    dlq_error: str = ""
    rejected: tuple[str, ...] = ()


class BeginResult(msgspec.Struct, frozen=True, kw_only=True):
    """``newly_classified`` is true only for the first classification of the message
    (and for a re-send of that same call). ``unplanned``: invocations the ledger
    records as not yet terminal that the request neither claimed, gated nor
    released (a rule that no longer matches, a function that is not loaded): the
    caller decides what each is and begins again with them. ``lost``: the broker
    no longer holds this delivery for this consumer (another consumer took the
    message first): nothing was classified, claimed or settled; drop it quietly."""

    newly_classified: bool
    statuses: tuple[ClaimStatus, ...]
    settlement: Settlement = Settlement()
    unplanned: tuple[str, ...] = ()
    lost: bool = False


class AttemptReport(msgspec.Struct, frozen=True, kw_only=True):
    """The fenced result of one claimed attempt; ``error`` is kept as the DLQ
    reason when ``transition`` exhausts."""

    field: str
    attempt: int
    transition: Transition
    error: str = ""


class FinishRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The fenced results of one delivery's claims, then the settlement (``gates``,
    ``released`` and ``blocked`` as in :class:`BeginRequest`)."""

    context: MessageContext
    token: str
    reports: tuple[AttemptReport, ...] = ()
    gates: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    blocked: bool = False


class RenewRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Extend ``field``'s claim (attempt ``attempt``, held by ``token``) so it
    lasts ``lease_ms`` from now: a handler never starts on a lease too short
    for its timeout."""

    context: MessageContext
    token: str
    field: str
    attempt: int
    lease_ms: int


class MalformedRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Dead-letter a payload that can never succeed, under ``-`` placeholders."""

    context: MessageContext
    reason: str
    event: str


def split_field(field: str) -> tuple[str, str]:
    """``function/handler`` -> (function, handler); function names have no ``/``."""
    function, _, handler = field.partition("/")
    return function, handler
