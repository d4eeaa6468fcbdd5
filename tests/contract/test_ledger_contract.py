"""The invocation ledger contract, run against the in-memory fake and real Redis.

Deadlines are rewritten in the ledger (as the original's tests do) instead of
waiting: an expired claim or backoff is a marker whose deadline is in the past.
"""

from __future__ import annotations

import anyio
import msgspec
import pytest

from relay.domain.invocation import Complete, Exhaust, Release, Retry
from relay.domain.outcome import (
    AttemptReport,
    BeginRequest,
    BeginResult,
    ClaimRequest,
    FinishRequest,
    MalformedRequest,
    MessageContext,
    RenewRequest,
    Settlement,
    StreamMessage,
)
from tests.contract.conftest import Harness

pytestmark = pytest.mark.anyio

A = "fn-a/events.a.handler"
B = "fn-b/events.b.handler"
PAST = "1000"


async def begin(
    h: Harness,
    message_id: str,
    token: str,
    fields: tuple[str, ...] = (A,),
    *,
    max_attempts: int = 5,
    gates: tuple[str, ...] | None = None,
    blocked: bool = False,
    classification: str = "matched:fn-a",
) -> BeginResult:
    return await h.ledger.begin(
        BeginRequest(
            context=h.ctx(message_id),
            classification=classification,
            token=token,
            claims=tuple(
                ClaimRequest(field=f, max_attempts=max_attempts, lease_ms=60_000) for f in fields
            ),
            gates=fields if gates is None else gates,
            blocked=blocked,
        )
    )


async def finish(
    h: Harness,
    message_id: str,
    token: str,
    reports: tuple[AttemptReport, ...],
    gates: tuple[str, ...] = (A,),
    released: tuple[str, ...] = (),
) -> Settlement:
    return await h.ledger.finish(
        FinishRequest(
            context=h.ctx(message_id),
            token=token,
            reports=reports,
            gates=gates,
            released=released,
        )
    )


def report(field: str, attempt: int, transition: object, error: str = "") -> AttemptReport:
    return AttemptReport(field=field, attempt=attempt, transition=transition, error=error)  # type: ignore[arg-type]


async def test_classification_is_recorded_once(harness: Harness) -> None:
    m = await harness.deliver()
    first = await begin(harness, m.id, "t1")
    second = await begin(harness, m.id, "t2", classification="unmatched")
    assert (first.newly_classified, second.newly_classified) == (True, False)
    assert (await harness.hash(m.id))["@class"] == "matched:fn-a#t1"  # and the token that wrote it


async def test_a_claim_protects_the_invocation_and_has_no_ttl(harness: Harness) -> None:
    m = await harness.deliver()
    first = await begin(harness, m.id, "t1")
    [status] = first.statuses
    assert (status.status, status.attempt, status.previous) == ("claimed", 1, "")
    marker = (await harness.hash(m.id))[A]
    assert marker.startswith("running:")
    assert marker.endswith("#1#t1")
    again = await begin(harness, m.id, "t2")
    assert again.statuses[0].status == "running"
    assert again.statuses[0].until_ms == status.until_ms
    assert not again.settlement.acknowledged
    assert await harness.ttl(m.id) == -1
    assert m.id in await harness.pending()


async def test_two_concurrent_claims_one_wins(harness: Harness) -> None:
    m = await harness.deliver()
    results: list[BeginResult] = []

    async def claim(token: str) -> None:
        results.append(await begin(harness, m.id, token))

    async with anyio.create_task_group() as tg:
        for token in ("t1", "t2", "t3", "t4"):
            tg.start_soon(claim, token)
    statuses = sorted(r.statuses[0].status for r in results)
    assert statuses == ["claimed", "running", "running", "running"]


async def test_success_acknowledges_and_keeps_the_ledger_48h(harness: Harness) -> None:
    m = await harness.deliver()
    await begin(harness, m.id, "t1")
    settled = await finish(harness, m.id, "t1", (report(A, 1, Complete()),))
    assert settled.acknowledged
    assert not settled.rejected
    assert (await harness.hash(m.id))[A] == "ok"
    assert 47 * 3600 < await harness.ttl(m.id) <= 48 * 3600
    assert m.id not in await harness.pending()


async def test_a_delivery_that_raced_the_acknowledgment_runs_nothing(harness: Harness) -> None:
    # Another worker read the message before it was acknowledged (recovery) and
    # begins only now: the kept ledger says every invocation is done.
    m = await harness.deliver()
    await begin(harness, m.id, "t1")
    assert (await finish(harness, m.id, "t1", (report(A, 1, Complete()),))).acknowledged
    late = await begin(harness, m.id, "t2")
    assert [s.status for s in late.statuses] == ["ok"]
    assert not late.newly_classified
    assert late.settlement.acknowledged
    assert (await harness.hash(m.id))[A] == "ok"


async def test_a_stale_token_is_rejected(harness: Harness) -> None:
    m = await harness.deliver()
    await begin(harness, m.id, "old")
    marker = (await harness.hash(m.id))[A]
    await harness.set_field(m.id, A, "running:" + PAST + "#1#old")  # the old claim expired
    taken = await begin(harness, m.id, "new")
    assert (taken.statuses[0].status, taken.statuses[0].attempt) == ("claimed", 2)
    for transition in (Complete(), Retry(60_000), Exhaust(), Release(marker)):
        late = await finish(harness, m.id, "old", (report(A, 1, transition),))
        assert late.rejected == (A,)
        assert not late.acknowledged
    assert (await harness.hash(m.id))[A].endswith("#2#new")
    done = await finish(harness, m.id, "new", (report(A, 2, Complete()),))
    assert done.acknowledged


async def test_failure_backs_off_then_retries_as_the_next_attempt(harness: Harness) -> None:
    m = await harness.deliver()
    await begin(harness, m.id, "t1")
    settled = await finish(harness, m.id, "t1", (report(A, 1, Retry(60_000)),))
    assert not settled.acknowledged
    marker = (await harness.hash(m.id))[A]
    assert marker.startswith("next_attempt_at:")
    assert marker.endswith("#1")
    skipped = await begin(harness, m.id, "t2")
    assert skipped.statuses[0].status == "backoff"
    assert skipped.statuses[0].until_ms == int(marker.split(":")[1].split("#")[0])
    await harness.set_field(m.id, A, f"next_attempt_at:{PAST}#1")
    retried = await begin(harness, m.id, "t3")
    assert (retried.statuses[0].status, retried.statuses[0].attempt) == ("claimed", 2)


async def test_exhaustion_writes_one_dlq_entry_per_invocation(harness: Harness) -> None:
    m = await harness.deliver(b'{"kind": "order"}')
    await begin(harness, m.id, "t1", (A, B), max_attempts=1)
    settled = await finish(
        harness,
        m.id,
        "t1",
        (report(A, 1, Exhaust(), "reason A"), report(B, 1, Exhaust(), "reason B")),
        gates=(A, B),
    )
    assert settled.acknowledged
    assert [d.field for d in settled.dead_lettered] == [A, B]
    entries = await harness.dlq()
    assert [(e["function"], e["handler"], e["reason"]) for e in entries] == [
        ("fn-a", "events.a.handler", "reason A"),
        ("fn-b", "events.b.handler", "reason B"),
    ]
    first = entries[0]
    assert first["event"] == '{"kind": "order"}'
    assert first["original_id"] == m.id
    assert first["original_stream"] == harness.stream.stream
    assert (first["group"], first["consumer"]) == (harness.stream.group, harness.stream.consumer)
    assert (first["deliveries"], first["handler_attempts"]) == ("1", "1")
    assert first["timestamp"] == "2027-01-15T08:00:00.000Z"
    # A redelivery (the XACK reply lost, say) writes nothing more.
    again = await begin(harness, m.id, "t2", (A, B), max_attempts=1)
    assert again.settlement.acknowledged
    assert not again.settlement.dead_lettered
    assert len(await harness.dlq()) == 2
    assert (await harness.hash(m.id))[A] == "exhausted:1:dlq"


async def test_only_missing_entries_are_written_on_redelivery(harness: Harness) -> None:
    m = await harness.deliver()
    await harness.set_field(m.id, A, "exhausted:2:dlq")
    await harness.set_field(m.id, B, "exhausted:3")
    result = await begin(harness, m.id, "t1", (A, B))
    assert [(d.field, d.attempt) for d in result.settlement.dead_lettered] == [(B, 3)]
    assert result.settlement.acknowledged
    [entry] = await harness.dlq()
    assert entry["handler_attempts"] == "3"
    assert entry["reason"].startswith("retries exhausted after 3 attempt(s)")


async def test_an_unwritable_dlq_keeps_the_message_pending_then_routes_it(
    harness: Harness,
) -> None:
    m = await harness.deliver()
    await begin(harness, m.id, "t1", max_attempts=1)
    await harness.break_dlq()
    failed = await finish(harness, m.id, "t1", (report(A, 1, Exhaust(), "boom"),))
    assert failed.dlq_error
    assert not failed.acknowledged
    assert (await harness.hash(m.id))[A] == "exhausted:1"
    assert m.id in await harness.pending()
    still = await begin(harness, m.id, "t2", max_attempts=1)
    assert still.statuses[0].status == "exhausted"
    assert still.settlement.dlq_error
    await harness.repair_dlq()
    routed = await begin(harness, m.id, "t3", max_attempts=1)
    assert routed.statuses[0].status == "exhausted"  # never claimed again
    assert routed.settlement.acknowledged
    [entry] = await harness.dlq()
    assert entry["reason"] == "boom"
    assert m.id not in await harness.pending()


async def test_an_expired_last_attempt_is_exhausted_without_running(harness: Harness) -> None:
    m = await harness.deliver()
    await harness.set_field(m.id, A, f"running:{PAST}#5#dead-worker")
    result = await begin(harness, m.id, "t1", max_attempts=5)
    [status] = result.statuses
    assert (status.status, status.attempt, status.newly) == ("exhausted", 5, True)
    assert result.settlement.acknowledged
    [entry] = await harness.dlq()
    assert entry["handler_attempts"] == "5"
    assert "did not finish before its deadline" in entry["reason"]


async def test_a_release_restores_the_replaced_marker(harness: Harness) -> None:
    m = await harness.deliver()
    first = await begin(harness, m.id, "t1")
    await finish(harness, m.id, "t1", (report(A, 1, Release(first.statuses[0].previous)),))
    assert A not in await harness.hash(m.id)
    await harness.set_field(m.id, A, f"next_attempt_at:{PAST}#2")
    second = await begin(harness, m.id, "t2")
    assert second.statuses[0].attempt == 3
    released = await finish(
        harness, m.id, "t2", (report(A, 3, Release(second.statuses[0].previous)),)
    )
    assert not released.acknowledged
    assert (await harness.hash(m.id))[A] == f"next_attempt_at:{PAST}#2"


async def test_unmatched_is_acknowledged_at_once(harness: Harness) -> None:
    m = await harness.deliver()
    result = await begin(harness, m.id, "t1", (), classification="unmatched")
    assert result.newly_classified
    assert result.settlement.acknowledged
    assert (await harness.hash(m.id))["@class"] == "unmatched#t1"
    assert m.id not in await harness.pending()


async def test_a_building_function_keeps_the_message_pending(harness: Harness) -> None:
    m = await harness.deliver()
    result = await begin(harness, m.id, "t1", (), gates=(A,), blocked=True)
    assert result.newly_classified
    assert not result.settlement.acknowledged
    assert A not in await harness.hash(m.id)  # no attempt charged
    assert m.id in await harness.pending()


async def test_a_removed_rule_no_longer_gates_the_ack(harness: Harness) -> None:
    m = await harness.deliver()
    await harness.set_field(m.id, "gone/old.handler", "running:99999999999999#1#other")
    started = await begin(harness, m.id, "t1")
    assert started.unplanned == ("gone/old.handler",)  # the caller must say what it is
    settled = await finish(
        harness, m.id, "t1", (report(A, 1, Complete()),), released=("gone/old.handler",)
    )
    assert settled.acknowledged


async def test_a_recorded_invocation_gates_the_ack_until_it_is_terminal(harness: Harness) -> None:
    """Defect 1 of the review: gates were only the rules matching now, so a retry
    waiting out its backoff was acknowledged away with no DLQ entry when its rule
    stopped matching (``now()`` patterns) or its function was not loaded."""
    m = await harness.deliver()
    await harness.set_field(m.id, B, "next_attempt_at:99999999999999#1")
    started = await begin(harness, m.id, "t1")
    assert started.unplanned == (B,)
    settled = await finish(harness, m.id, "t1", (report(A, 1, Complete()),))
    assert not settled.acknowledged
    assert m.id in await harness.pending()
    await harness.set_field(m.id, B, "exhausted:2")  # exhausted, its function since removed
    settled = await finish(harness, m.id, "t1", (), released=(B,))
    assert settled.acknowledged
    assert [d.field for d in settled.dead_lettered] == [B]  # the DLQ entry first, always
    assert [e["function"] for e in await harness.dlq()] == ["fn-b"]


async def test_malformed_gets_one_placeholder_entry(harness: Harness) -> None:
    m = await harness.deliver(b"[1, 2]")
    request = MalformedRequest(context=harness.ctx(m.id), reason="not an object", event="[1, 2]")
    first = await harness.ledger.dead_letter_malformed(request)
    second = await harness.ledger.dead_letter_malformed(request)
    assert first.acknowledged
    assert second.acknowledged
    assert [d.field for d in first.dead_lettered] == ["-"]
    assert not second.dead_lettered
    [entry] = await harness.dlq()
    assert (entry["function"], entry["handler"], entry["handler_attempts"]) == ("-", "-", "0")
    assert entry["event"] == "[1, 2]"
    assert "@class" not in await harness.hash(m.id)


async def test_malformed_with_an_unwritable_dlq_stays_pending(harness: Harness) -> None:
    m = await harness.deliver(b"nope")
    request = MalformedRequest(context=harness.ctx(m.id), reason="not JSON", event="nope")
    await harness.break_dlq()
    failed = await harness.ledger.dead_letter_malformed(request)
    assert failed.dlq_error
    assert not failed.acknowledged
    assert m.id in await harness.pending()
    await harness.repair_dlq()
    assert (await harness.ledger.dead_letter_malformed(request)).acknowledged
    assert len(await harness.dlq()) == 1


async def test_a_re_sent_begin_returns_its_own_claim_and_burns_no_attempt(harness: Harness) -> None:
    """Defect 6 of the review: a begin re-sent after a connection break found its own
    claim, took it for someone else's and ran nothing; the claim then expired and
    was counted (with ``retries: 0``, dead-lettered without ever running)."""
    m = await harness.deliver()
    first = await begin(harness, m.id, "t1", max_attempts=1)
    again = await begin(harness, m.id, "t1", max_attempts=1)
    assert again.statuses == first.statuses
    assert again.statuses[0].status == "claimed"
    assert again.newly_classified  # the classification this call made, reported again
    settled = await finish(harness, m.id, "t1", (report(A, 1, Complete()),))
    assert settled.acknowledged
    assert (await harness.hash(m.id))[A] == "ok"


async def test_a_re_sent_finish_is_not_taken_for_a_stale_worker(harness: Harness) -> None:
    """Defect 6 of the review: a finish re-sent after it was applied was reported
    as fenced, and the exhaustion and its DLQ entry went unreported."""
    m = await harness.deliver()
    await begin(harness, m.id, "t1", max_attempts=1)
    reports = (report(A, 1, Exhaust(), "retries exhausted after 1 attempt(s): boom"),)
    first = await finish(harness, m.id, "t1", reports)
    again = await finish(harness, m.id, "t1", reports)
    assert first.rejected == again.rejected == ()
    assert first.acknowledged
    assert again.acknowledged
    assert [d.field for d in first.dead_lettered] == [A]
    assert [(d.field, d.entry_id) for d in again.dead_lettered] == [
        (d.field, d.entry_id) for d in first.dead_lettered
    ]
    assert len(await harness.dlq()) == 1


async def test_a_re_sent_retry_and_release_are_applied_once(harness: Harness) -> None:
    m = await harness.deliver()
    await begin(harness, m.id, "t1", (A, B), gates=(A, B))
    reports = (report(A, 1, Retry(60_000)), report(B, 1, Release("")))
    first = await finish(harness, m.id, "t1", reports, gates=(A, B))
    h = await harness.hash(m.id)
    again = await finish(harness, m.id, "t1", reports, gates=(A, B))
    assert first.rejected == again.rejected == ()
    assert await harness.hash(m.id) == h


async def test_renew_extends_only_the_holders_claim(harness: Harness) -> None:
    m = await harness.deliver()
    started = await begin(harness, m.id, "t1")
    until = started.statuses[0].until_ms
    mine = RenewRequest(
        context=harness.ctx(m.id), token="t1", field=A, attempt=1, lease_ms=10 * 60_000
    )
    renewed = await harness.ledger.renew(mine)
    assert renewed > until
    assert (await harness.hash(m.id))[A] == f"running:{renewed}#1#t1"
    stale = RenewRequest(context=harness.ctx(m.id), token="t0", field=A, attempt=1, lease_ms=1)
    assert await harness.ledger.renew(stale) == 0
    wrong_attempt = RenewRequest(
        context=harness.ctx(m.id), token="t1", field=A, attempt=2, lease_ms=1
    )
    assert await harness.ledger.renew(wrong_attempt) == 0
    await finish(harness, m.id, "t1", (report(A, 1, Complete()),))
    assert await harness.ledger.renew(mine) == 0  # finished: nothing to extend


# --- the batched calls: every member as its own call would, in one call -------------


def batch_ctx(h: Harness, m: StreamMessage) -> MessageContext:
    """The member's context with its delivery handle (the embedded broker's lease)."""
    return msgspec.structs.replace(h.ctx(m.id), delivery=m.delivery)


def claim_of(h: Harness, m: StreamMessage, token: str, max_attempts: int = 5) -> BeginRequest:
    return BeginRequest(
        context=batch_ctx(h, m),
        classification="matched:fn-a",
        token=token,
        claims=(ClaimRequest(field=A, max_attempts=max_attempts, lease_ms=60_000),),
        gates=(A,),
    )


def result_of(h: Harness, m: StreamMessage, token: str, transition: object) -> FinishRequest:
    return FinishRequest(
        context=batch_ctx(h, m),
        token=token,
        reports=(report(A, 1, transition, "boom"),),
        gates=(A,),
    )


async def test_a_batch_claims_each_member_as_its_own_begin_would(harness: Harness) -> None:
    fresh, taken, done = [await harness.deliver() for _ in range(3)]
    await begin(harness, taken.id, "t0")  # another delivery holds its claim
    await begin(harness, done.id, "t0")
    await finish(harness, done.id, "t0", (report(A, 1, Complete()),))
    results = await harness.ledger.begin_many(
        [claim_of(harness, m, "t1") for m in (fresh, taken, done)]
    )
    assert [r.statuses[0].status for r in results] == ["claimed", "running", "ok"]
    assert [r.newly_classified for r in results] == [True, False, False]
    assert [r.settlement.acknowledged for r in results] == [False, False, True]
    assert not any(r.lost for r in results)
    assert (await harness.hash(fresh.id))[A].endswith("#1#t1")
    assert (await harness.hash(taken.id))[A].endswith("#1#t0")  # untouched
    assert await harness.pending() == {fresh.id, taken.id}


async def test_a_group_settles_each_member_and_acks_only_the_terminal_ones(
    harness: Harness,
) -> None:
    ok, retry, exhausted = [await harness.deliver() for _ in range(3)]
    messages = (ok, retry, exhausted)
    await harness.ledger.begin_many([claim_of(harness, m, "t1") for m in messages])
    group = [
        result_of(harness, ok, "t1", Complete()),
        result_of(harness, retry, "t1", Retry(60_000)),
        result_of(harness, exhausted, "t1", Exhaust()),
    ]
    first = await harness.ledger.finish_many(group)
    assert [s.acknowledged for s in first] == [True, False, True]
    assert [len(s.dead_lettered) for s in first] == [0, 0, 1]
    assert await harness.pending() == {retry.id}
    again = await harness.ledger.finish_many(group)  # re-sent (a broken connection)
    assert [s.acknowledged for s in again] == [True, False, True]
    assert [s.rejected for s in again] == [(), (), ()]
    assert again[2].dead_lettered == first[2].dead_lettered  # reported, not written twice
    [entry] = await harness.dlq()
    assert entry["original_id"] == exhausted.id
    assert (await harness.hash(exhausted.id))[A] == "exhausted:1:dlq"


async def test_a_stale_member_of_a_group_is_fenced_alone(harness: Harness) -> None:
    ours, stale = [await harness.deliver() for _ in range(2)]
    await harness.ledger.begin_many([claim_of(harness, m, "t1") for m in (ours, stale)])
    settled = await harness.ledger.finish_many(
        [result_of(harness, ours, "t1", Complete()), result_of(harness, stale, "t9", Complete())]
    )
    assert [s.rejected for s in settled] == [(), (A,)]
    assert [s.acknowledged for s in settled] == [True, False]
    assert (await harness.hash(stale.id))[A].endswith("#1#t1")  # the holder's claim stands
    assert await harness.pending() == {stale.id}


async def test_empty_batches_answer_nothing(harness: Harness) -> None:
    assert await harness.ledger.begin_many([]) == []
    assert await harness.ledger.finish_many([]) == []
