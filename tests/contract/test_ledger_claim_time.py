"""The ledger records when each claim was taken (``@at:<field>``), fake and Redis alike.

``relay trace`` shows it as a running invocation's token age. The claim time is the
same server clock reading as the claim's deadline, so ``@at == until_ms - lease``;
it also names the claim's token (``<ms>#<token>``), which is how a re-sent call
recognises its own work.
"""

from __future__ import annotations

import pytest

from relay.domain.invocation import Complete, Release, Retry, claimed_at_field
from relay.domain.ledger_rules import parse_claim_stamp
from tests.contract.conftest import Harness
from tests.contract.test_ledger_contract import PAST, A, B, begin, finish, report

pytestmark = pytest.mark.anyio

LEASE_MS = 60_000  # the lease ``begin`` asks for


def claimed_ms(stamp: str) -> int | None:
    return parse_claim_stamp(stamp)[0]


async def test_a_claim_records_its_claim_time(harness: Harness) -> None:
    m = await harness.deliver()
    result = await begin(harness, m.id, "t1", (A, B), gates=(A, B))
    h = await harness.hash(m.id)
    for status in result.statuses:
        assert status.status == "claimed"
        assert parse_claim_stamp(h[claimed_at_field(status.field)]) == (
            status.until_ms - LEASE_MS,
            "t1",
        )


async def test_a_skipped_claim_keeps_the_first_claim_time(harness: Harness) -> None:
    m = await harness.deliver()
    first = await begin(harness, m.id, "t1")
    again = await begin(harness, m.id, "t2")
    assert again.statuses[0].status == "running"
    at = (await harness.hash(m.id))[claimed_at_field(A)]
    assert claimed_ms(at) == first.statuses[0].until_ms - LEASE_MS


async def test_a_reclaim_records_the_new_claim_time(harness: Harness) -> None:
    m = await harness.deliver()
    await harness.set_field(m.id, A, f"running:{PAST}#1#dead-worker")
    await harness.set_field(m.id, claimed_at_field(A), "5")
    taken = await begin(harness, m.id, "t2")
    assert (taken.statuses[0].status, taken.statuses[0].attempt) == ("claimed", 2)
    at = (await harness.hash(m.id))[claimed_at_field(A)]
    assert claimed_ms(at) == taken.statuses[0].until_ms - LEASE_MS


async def test_results_keep_the_claim_time_and_it_never_gates(harness: Harness) -> None:
    m = await harness.deliver()
    first = await begin(harness, m.id, "t1")
    claimed_at = first.statuses[0].until_ms - LEASE_MS
    await finish(harness, m.id, "t1", (report(A, 1, Retry(60_000)),))
    assert claimed_ms((await harness.hash(m.id))[claimed_at_field(A)]) == claimed_at
    await harness.set_field(m.id, A, f"next_attempt_at:{PAST}#1")
    second = await begin(harness, m.id, "t2")
    settled = await finish(harness, m.id, "t2", (report(A, 2, Complete()),))
    assert settled.acknowledged  # the @at field is no invocation: it gates nothing
    h = await harness.hash(m.id)
    assert h[A] == "ok"
    assert claimed_ms(h[claimed_at_field(A)]) == second.statuses[0].until_ms - LEASE_MS


async def test_a_released_claim_leaves_no_claim_time(harness: Harness) -> None:
    m = await harness.deliver()
    first = await begin(harness, m.id, "t1")
    await finish(harness, m.id, "t1", (report(A, 1, Release(first.statuses[0].previous)),))
    h = await harness.hash(m.id)
    assert A not in h
    assert claimed_at_field(A) not in h
    await harness.set_field(m.id, A, f"next_attempt_at:{PAST}#2")
    second = await begin(harness, m.id, "t2")
    await finish(harness, m.id, "t2", (report(A, 3, Release(second.statuses[0].previous)),))
    h = await harness.hash(m.id)
    assert h[A] == f"next_attempt_at:{PAST}#2"
    assert claimed_at_field(A) not in h
