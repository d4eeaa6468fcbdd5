"""``relay trace`` explains a schedule occurrence like any message (pure rendering)."""

from __future__ import annotations

from relay.domain.message_facts import MessageFacts
from relay.entrypoints.cli.trace_render import render_trace

OCC = "schedule:jobs:jobs.nightly.handler:2026-06-01T03:00:00Z"


def facts(ledger: dict[str, str], *, pending: bool) -> MessageFacts:
    return MessageFacts(
        message_id="1-0",
        stream="events",
        group="relay",
        now_ms=1_780_282_900_000,
        ledger=ledger,
        ledger_ttl_s=3600 if not pending else -1,
        body_bytes=180,
        pending={"consumer": "w1", "idle_ms": 5000, "deliveries": 1} if pending else None,
    )


def test_an_occurrence_names_its_identity() -> None:
    lines = render_trace(facts({"@class": f"{OCC}#t1", "jobs/jobs.nightly.handler": "ok"},
                               pending=False))
    assert f"Classified:   schedule occurrence {OCC} (matching bypassed)" in lines
    assert lines[-1].startswith("Verdict:      finished: acknowledged (")


def test_an_occurrence_acknowledged_without_a_run_says_why() -> None:
    lines = render_trace(facts({"@class": f"{OCC}#t1"}, pending=False))
    assert lines[-1] == (
        "Verdict:      finished: acknowledged without a run (obsolete: its schedule was removed,"
        " skipped: overlap: skip, or forged: a copy of the entry publish-if-new appended;"
        " the worker's log says which)"
    )


def test_an_occurrence_whose_ack_is_missing_is_recognised() -> None:
    lines = render_trace(facts({"@class": f"{OCC}#t1", "jobs/jobs.nightly.handler": "ok"},
                               pending=True))
    assert "acknowledgment failed" in lines[-1]
