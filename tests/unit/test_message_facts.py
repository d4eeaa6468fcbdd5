"""The domain's reading of one message's ledger (``relay trace`` only renders it)."""

from __future__ import annotations

from relay.domain.classification import matched
from relay.domain.ledger_rules import CLASS_FIELD, class_stamp
from relay.domain.message_facts import MessageFacts, Verdict, every_gate_terminal, verdict
from relay.domain.schedule import ID_PREFIX
from relay.entrypoints.cli.trace_render import VERDICT_TEXT

NOW = 1_800_000_000_000
PENDING = {"consumer": "w1", "idle_ms": 5, "deliveries": 2}


def facts(ledger: dict[str, str]) -> MessageFacts:
    return MessageFacts("1-0", "s", "g", NOW, ledger=ledger, body_bytes=10, pending=PENDING)


def test_every_verdict_has_its_words() -> None:
    assert set(VERDICT_TEXT) == set(Verdict)


def test_every_gate_terminal_needs_an_invocation_of_every_matched_function() -> None:
    cls = {CLASS_FIELD: class_stamp(matched(["a", "b"]), "t1")}
    only_a = facts({**cls, "a/h": "ok"})
    assert not every_gate_terminal(only_a)  # b never ran (still building): it gates
    assert verdict(only_a) is Verdict.PENDING
    both = facts({**cls, "a/h": "ok", "b/h": "exhausted:3:dlq"})
    assert every_gate_terminal(both)
    assert verdict(both) is Verdict.ACK_MISSING
    unwritten = facts({**cls, "a/h": "ok", "b/h": "exhausted:3"})
    assert not every_gate_terminal(unwritten)
    assert verdict(unwritten) is Verdict.DLQ_WRITE_PENDING


def test_an_occurrence_is_gated_by_its_schedules_invocation_alone() -> None:
    cls = {CLASS_FIELD: class_stamp(f"{ID_PREFIX}jobs/h@2026-01-01T00:00:00Z", "t1")}
    assert every_gate_terminal(facts({**cls, "jobs/h": "ok"}))
    assert not every_gate_terminal(facts(cls))


def test_an_unmatched_or_unclassified_message_has_no_gates_to_be_terminal() -> None:
    assert not every_gate_terminal(facts({CLASS_FIELD: class_stamp("unmatched", "t1")}))
    assert not every_gate_terminal(facts({"a/h": "ok"}))
