"""``begin_many`` / ``finish_many`` against every ledger: one call for a batch of
messages answers each member exactly as the rules answer it alone (the in-memory
ledger runs :mod:`relay.domain.ledger_rules` directly; the embedded broker runs
the whole batch in one transaction).
"""

from __future__ import annotations

import pytest

from relay.domain.invocation import Complete, Exhaust
from relay.domain.outcome import AttemptReport, BeginRequest, ClaimRequest, FinishRequest
from tests.contract.conftest import Harness

pytestmark = pytest.mark.anyio

A = "fn-a/events.a.handler"
PAST = "1000"


def begin_request(h: Harness, message_id: str, token: str) -> BeginRequest:
    return BeginRequest(
        context=h.ctx(message_id), classification="matched:fn-a", token=token,
        claims=(ClaimRequest(field=A, max_attempts=3, lease_ms=60_000),), gates=(A,),
    )


def finish_request(h: Harness, message_id: str, token: str, attempt: int,
                   transition: object) -> FinishRequest:
    report = AttemptReport(field=A, attempt=attempt, transition=transition,  # type: ignore[arg-type]
                           error="boom" if isinstance(transition, Exhaust) else "")
    return FinishRequest(context=h.ctx(message_id), token=token, reports=(report,), gates=(A,))


async def test_a_mixed_batch_answers_each_member_as_the_rules_do(harness: Harness) -> None:
    """A batch of a fresh message, one whose claim another worker holds, one done
    and acknowledged, one exhausted without its DLQ entry yet, and one whose old
    claim expired (its stale worker fenced out): one ``begin_many`` claims the
    fresh and the expired ones (attempts 1 and 2), leaves the held one running,
    finds the done one done, dead-letters the exhausted one once and
    acknowledges it; one ``finish_many`` then settles both claims, the second
    exhausting into the DLQ."""
    fresh, running, done, exhausted, expired = [await harness.deliver() for _ in range(5)]
    held = await harness.ledger.begin(begin_request(harness, running.id, "other"))
    assert held.statuses[0].status == "claimed"
    await harness.ledger.begin(begin_request(harness, done.id, "t0"))
    finished = await harness.ledger.finish(finish_request(harness, done.id, "t0", 1, Complete()))
    assert finished.acknowledged
    await harness.set_field(exhausted.id, A, "exhausted:3")
    await harness.ledger.begin(begin_request(harness, expired.id, "old"))
    await harness.set_field(expired.id, A, "running:" + PAST + "#1#old")
    batch = (fresh, running, done, exhausted, expired)
    begun = await harness.ledger.begin_many([begin_request(harness, m.id, "t") for m in batch])
    assert [(r.statuses[0].status, r.statuses[0].attempt) for r in begun] == [
        ("claimed", 1), ("running", 1), ("ok", 0), ("exhausted", 3), ("claimed", 2)
    ]
    assert [r.settlement.acknowledged for r in begun] == [False, False, True, True, False]
    assert [len(r.settlement.dead_lettered) for r in begun] == [0, 0, 0, 1, 0]
    assert not any(r.lost for r in begun)
    settled = await harness.ledger.finish_many([
        finish_request(harness, fresh.id, "t", 1, Complete()),
        finish_request(harness, expired.id, "t", 2, Exhaust()),
    ])
    assert [s.acknowledged for s in settled] == [True, True]
    assert [len(s.dead_lettered) for s in settled] == [0, 1]
    pending = await harness.pending()
    assert running.id in pending
    assert pending.isdisjoint({fresh.id, done.id, exhausted.id, expired.id})
    entries = [(e["original_id"], e["handler_attempts"]) for e in await harness.dlq()]
    assert sorted(entries) == sorted([(exhausted.id, "3"), (expired.id, "2")])
    assert (await harness.hash(expired.id))[A] == "exhausted:2:dlq"
    assert (await harness.hash(running.id))[A].endswith("#1#other")
