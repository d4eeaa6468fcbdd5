"""``relay trace``'s words: the facts of one message (:mod:`relay.domain.message_facts`)
rendered as text. Pure; shared by the text and the ``--json`` output. The verdict
is the domain's; this module only says it in words."""

from __future__ import annotations

from datetime import UTC, datetime

from relay.domain.classification import ClassKind
from relay.domain.durations import MILLISECOND, format_duration
from relay.domain.invocation import BackingOff, Exhausted, Ok, Running, parse_marker
from relay.domain.message_facts import (
    DLQ_SCAN_LIMIT,
    NO_EXPIRY_TTL,
    NO_KEY_TTL,
    MessageFacts,
    Verdict,
    verdict,
)

VERDICT_TEXT: dict[Verdict, str] = {
    Verdict.DELAYED: "delayed: deliverable from {until}, not before",
    Verdict.MALFORMED: (
        "malformed (not a JSON object event, or too large): dead-lettered without running"
    ),
    Verdict.ACKNOWLEDGED_WITHOUT_RUN: (
        "finished: acknowledged without a run (obsolete: its schedule was removed,"
        " skipped: overlap: skip, or forged: a copy of the entry publish-if-new"
        " appended; the worker's log says which)"
    ),
    Verdict.FINISHED: (
        "finished: acknowledged (the ledger is kept for inspection until it expires)"
    ),
    Verdict.UNKNOWN: "unknown: no such entry, no ledger and not pending (wrong id, or long gone)",
    Verdict.NOT_DELIVERED: "not delivered yet, or acknowledged before its ledger expired",
    Verdict.BODY_GONE: (
        "pending but its body is gone (trimmed): it will be dropped without running"
    ),
    Verdict.NOT_CLASSIFIED: (
        "pending and not classified yet: waiting for a worker (or Redis errors on claim)"
    ),
    Verdict.BACKING_OFF: "waiting out a retry backoff; recovery redelivers it after the deadline",
    Verdict.RUNNING: (
        "an attempt is running (or its worker died and the claim has not expired yet)"
    ),
    Verdict.DLQ_WRITE_PENDING: (
        "exhausted but the DLQ write has not succeeded yet; recovery retries it"
    ),
    Verdict.ACK_MISSING: (
        "every invocation is finished but the acknowledgment failed (the worker's log says"
        " ledger_unavailable); recovery redelivers it and it is acknowledged, nothing runs"
        " again"
    ),
    Verdict.PENDING: (
        "pending; the recovery loop will redeliver it (idle entries are reclaimed every 1m)"
    ),
}


def verdict_of(facts: MessageFacts) -> tuple[str, str]:
    """``(code, text)``: the domain's stable code (``--json``) and its words."""
    found = verdict(facts)
    text = VERDICT_TEXT[found]
    if facts.delayed_until_ms is not None:
        text = text.format(until=stamp(facts.delayed_until_ms))
    return found.value, text


def verdict_text(facts: MessageFacts) -> str:
    """The short answer to "why has this event not finished?"."""
    return verdict_of(facts)[1]


def render_trace(facts: MessageFacts) -> list[str]:
    lines = [
        f"Message:      {facts.message_id} (stream {facts.stream}, group {facts.group})",
        f"Event:        {_body(facts)}",
        *([] if facts.delayed_until_ms is None else [f"Delayed:      {_delayed(facts)}"]),
        f"Pending:      {_pending(facts)}",
        f"Classified:   {_classified(facts)}",
        f"Ledger:       {_ledger(facts)}",
    ]
    malformed = facts.malformed_entry()
    if malformed is not None:
        lines.append(f"Malformed:    dead-lettered at once as entry {malformed}")
    invocations = facts.invocations()
    if invocations:
        lines.append("Invocations:")
        width = max(len(name) for name in invocations)
        for name in invocations:
            state = describe_marker(facts.ledger[name], facts.now_ms, facts.claimed_at_ms(name))
            lines.append(f"  {name:<{width}}  {state}")
            reason = facts.last_error(name)
            if reason:
                lines.append(f"  {'':<{width}}  last error: {reason}")
    lines += _dlq_lines(facts)
    lines.append(f"Verdict:      {verdict_text(facts)}")
    return lines


def describe_marker(text: str, now_ms: int, claimed_at_ms: int | None = None) -> str:
    """One invocation's state, attempt and timing, in words.

    ``claimed_at_ms`` (the ledger's ``@at:<field>``, server clock) is when the
    current claim was taken: a running invocation shows it as its token age.
    """
    match parse_marker(text):
        case Ok():
            return "completed"
        case Running(deadline_ms, attempt, token):
            left = deadline_ms - now_ms
            until = (
                f"protected for {ms_text(left)} more"
                if left > 0
                else f"claim expired {ms_text(-left)} ago (its worker died or stalled)"
            )
            age = ""
            if claimed_at_ms is not None:  # the token age
                age = f"claimed {ms_text(max(0, now_ms - claimed_at_ms))} ago, "
            return f"running attempt {attempt} (claim {token[:8]}), {age}{until}"
        case BackingOff(deadline_ms, attempt):
            left = deadline_ms - now_ms
            when = f"in {ms_text(left)}" if left > 0 else f"due since {ms_text(-left)}"
            return f"attempt {attempt} failed; next attempt at {stamp(deadline_ms)} ({when})"
        case Exhausted(attempt, dead_lettered):
            written = "its DLQ entry is written" if dead_lettered else "DLQ entry NOT written yet"
            return f"exhausted after {attempt} attempt{'s' if attempt != 1 else ''}; {written}"
    return f"unreadable marker {text!r} (treated as eligible: runs at the next delivery)"


def _delayed(facts: MessageFacts) -> str:
    assert facts.delayed_until_ms is not None
    left = facts.delayed_until_ms - facts.now_ms
    return (
        f"until {stamp(facts.delayed_until_ms)} (in {ms_text(max(0, left))};"
        " not in the queue yet)"
    )


def _body(facts: MessageFacts) -> str:
    if facts.body_bytes is None:
        return "gone (trimmed or deleted from the stream)"
    return f"present ({facts.body_bytes} bytes)"


def _pending(facts: MessageFacts) -> str:
    if facts.pending is None:
        return "no (acknowledged, or never delivered to this group)"
    p = facts.pending
    times = "time" if p["deliveries"] == 1 else "times"
    return (
        f"yes, with consumer {p['consumer']} (idle {ms_text(p['idle_ms'])}, "
        f"delivered {p['deliveries']} {times})"
    )


def _classified(facts: MessageFacts) -> str:
    found = facts.classification()
    if found is None:
        return "not yet"
    if found.kind is ClassKind.MATCHED:
        return "matched: " + ", ".join(found.functions)
    if found.kind is ClassKind.OCCURRENCE:
        return f"schedule occurrence {found.text} (matching bypassed)"
    return found.text


def _ledger(facts: MessageFacts) -> str:
    if facts.ledger_ttl_s == NO_KEY_TTL:
        return "none"
    if facts.ledger_ttl_s == NO_EXPIRY_TTL:
        return "kept while the message is pending (no expiry)"
    return f"expires in {ms_text(facts.ledger_ttl_s * 1000)}"


def _dlq_lines(facts: MessageFacts) -> list[str]:
    if not facts.dead_letters:
        scanned = "" if facts.dlq_scan_complete else f" in the first {DLQ_SCAN_LIMIT} examined"
        return [f"Dead letters: none{scanned}"]
    lines = ["Dead letters:"]
    for e in facts.dead_letters:
        lines.append(
            f"  {e.id}  {e.get('function')}/{e.get('handler')}  "
            f"attempts={e.get('handler_attempts')} deliveries={e.get('deliveries')}  "
            f"{e.get('reason')}"
        )
    return lines


def ms_text(ms: int) -> str:
    return format_duration((ms // 1000) * 1000 * MILLISECOND) if ms >= 1000 else f"{ms}ms"


def stamp(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
