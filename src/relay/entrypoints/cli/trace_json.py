"""``relay trace --json``: the facts of one message as the ``relay.trace/1`` document.

The same facts the text shows, as data: states are codes (``completed``,
``running``, ...), instants RFC3339 UTC, durations integer milliseconds. The
shape is ``docs/schemas/trace.v1.json``.
"""

from __future__ import annotations

from typing import Any

from relay.domain.classification import ClassKind
from relay.domain.invocation import BackingOff, Exhausted, Ok, Running, parse_marker
from relay.domain.message_facts import NO_KEY_TTL, DeadLetterFact, MessageFacts
from relay.entrypoints.cli.trace_render import describe_marker, stamp, verdict_of


def trace_document(facts: MessageFacts) -> dict[str, Any]:
    """The body of ``relay.trace/1`` (``emit_json`` adds the ``schema`` field)."""
    code, text = verdict_of(facts)
    found = facts.classification()
    matched = list(found.functions) if found and found.kind is ClassKind.MATCHED else []
    return {
        "message_id": facts.message_id,
        "stream": facts.stream,
        "group": facts.group,
        "read_at": stamp(facts.now_ms),
        "event": {"present": facts.body_bytes is not None, "bytes": facts.body_bytes},
        "pending": None if facts.pending is None else dict(facts.pending),
        "classification": None if found is None else found.text,
        "matched_functions": matched,
        "ledger": {
            "exists": facts.ledger_ttl_s != NO_KEY_TTL,
            "expires_in_s": facts.ledger_ttl_s if facts.ledger_ttl_s >= 0 else None,
        },
        "malformed_entry": facts.malformed_entry(),
        "invocations": [_invocation(facts, name) for name in facts.invocations()],
        "dead_letters": [_dead_letter(e) for e in facts.dead_letters],
        "dead_letters_complete": facts.dlq_scan_complete,
        "delayed_until": (
            None if facts.delayed_until_ms is None else stamp(facts.delayed_until_ms)
        ),
        "verdict": {"code": code, "text": text},
    }


def _invocation(facts: MessageFacts, name: str) -> dict[str, Any]:
    raw = facts.ledger[name]
    claimed_at = facts.claimed_at_ms(name)
    function, _, handler = name.partition("/")
    doc: dict[str, Any] = {
        "name": name,
        "function": function,
        "handler": handler,
        "state": "unreadable",
        "attempt": None,
        "deadline": None,
        "dead_lettered": None,
        "claimed_at": None if claimed_at is None else stamp(claimed_at),
        "last_error": facts.last_error(name),
        "description": describe_marker(raw, facts.now_ms, claimed_at),
    }
    match parse_marker(raw):
        case Ok():
            doc["state"] = "completed"
        case Running(deadline_ms, attempt, _token):
            doc.update(state="running", attempt=attempt, deadline=stamp(deadline_ms))
        case BackingOff(deadline_ms, attempt):
            doc.update(state="backing_off", attempt=attempt, deadline=stamp(deadline_ms))
        case Exhausted(attempt, dead_lettered):
            doc.update(state="exhausted", attempt=attempt, dead_lettered=dead_lettered)
    return doc


def _dead_letter(entry: DeadLetterFact) -> dict[str, Any]:
    return {
        "id": entry.id,
        "function": entry.get("function"),
        "handler": entry.get("handler"),
        "attempts": _int(entry.get("handler_attempts")),
        "deliveries": _int(entry.get("deliveries")),
        "reason": entry.get("reason"),
        "timestamp": entry.get("timestamp") or None,
    }


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None
