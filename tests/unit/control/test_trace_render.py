from __future__ import annotations

from relay.domain.message_facts import MessageFacts
from relay.entrypoints.cli.trace_render import describe_marker, render_trace
from relay.entrypoints.cli.trace_render import verdict_text as verdict

NOW = 1_800_000_000_000


def test_markers_in_words() -> None:
    assert describe_marker("ok", NOW) == "completed"
    assert describe_marker(f"running:{NOW + 4_000}#3#abcdef123456", NOW) == (
        "running attempt 3 (claim abcdef12), protected for 4s more"
    )
    assert "claim expired 1m ago" in describe_marker(f"running:{NOW - 60_000}#1#tok", NOW)
    assert describe_marker(f"next_attempt_at:{NOW + 80_000}#2", NOW).endswith("(in 1m20s)")
    assert "due since 5s" in describe_marker(f"next_attempt_at:{NOW - 5_000}#2", NOW)
    assert describe_marker("exhausted:1", NOW) == (
        "exhausted after 1 attempt; DLQ entry NOT written yet"
    )
    assert describe_marker("garbage", NOW).startswith("unreadable marker 'garbage'")


def test_verdicts() -> None:
    acked = MessageFacts("1-0", "s", "g", NOW, ledger={"@class": "unmatched"}, body_bytes=10)
    assert verdict(acked).startswith("finished")
    waiting = MessageFacts("1-0", "s", "g", NOW, body_bytes=10,
                           pending={"consumer": "c", "idle_ms": 5, "deliveries": 1})
    assert verdict(waiting).startswith("pending and not classified yet")
    trimmed = MessageFacts("1-0", "s", "g", NOW, body_bytes=None,
                           pending={"consumer": "c", "idle_ms": 5, "deliveries": 2})
    assert "body is gone" in verdict(trimmed)
    lines = render_trace(waiting)
    assert lines[2] == "Pending:      yes, with consumer c (idle 5ms, delivered 1 time)"
    assert "Dead letters: none" in lines


def test_a_malformed_message() -> None:
    facts = MessageFacts("1-0", "s", "g", NOW, ledger={"@dlq": "5-0"}, body_bytes=3,
                         ledger_ttl_s=100)
    lines = render_trace(facts)
    assert "Malformed:    dead-lettered at once as entry 5-0" in lines
    assert lines[-1].startswith("Verdict:      malformed")


def test_a_running_invocation_shows_its_token_age() -> None:
    marker = f"running:{NOW + 48_000}#2#abcdef123456"
    assert describe_marker(marker, NOW, NOW - 12_000) == (
        "running attempt 2 (claim abcdef12), claimed 12s ago, protected for 48s more"
    )
    expired = describe_marker(f"running:{NOW - 60_000}#1#tok", NOW, NOW - 180_000)
    assert "claimed 3m ago, claim expired 1m ago" in expired
    field = "users/events.created.handler"
    facts = MessageFacts(
        "1-0", "s", "g", NOW, body_bytes=10,
        ledger={"@class": "matched:users", field: marker, f"@at:{field}": str(NOW - 12_000)},
        pending={"consumer": "c", "idle_ms": 5, "deliveries": 1},
    )
    lines = render_trace(facts)
    assert f"  {field}  running attempt 2 (claim abcdef12), claimed 12s ago, " \
        "protected for 48s more" in lines
    assert not any("@at:" in line for line in lines)  # a reserved field, never an invocation
    assert verdict(facts).startswith("an attempt is running")
