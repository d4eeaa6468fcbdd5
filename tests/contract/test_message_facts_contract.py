"""The ``MessageFactsReader`` contract (``relay trace``'s read side): one message
taken through the real ledger calls, then read back, on the in-memory fake, Redis
and the embedded broker's file. Each broker must report the same facts, so the
domain gives the same verdict whichever broker a trace reads."""

from __future__ import annotations

import pytest

from relay.adapters.redis.message_facts import RedisMessageFacts
from relay.adapters.sqlite.broker.message_facts import SqliteMessageFacts
from relay.application.ports import MessageFactsReader
from relay.domain.invocation import Complete, Retry
from relay.domain.message_facts import NO_EXPIRY_TTL, NO_KEY_TTL, Verdict, verdict
from relay.domain.outcome import MalformedRequest
from tests.contract.conftest import Harness, MemoryHarness, RedisHarness, SqliteHarness
from tests.contract.test_ledger_contract import A, begin, finish, report
from tests.fakes_admin import InMemoryMessageFacts

pytestmark = pytest.mark.anyio

PAYLOAD = b'{"table": "users", "n": 1}'


def reader(h: Harness) -> MessageFactsReader:
    if isinstance(h, MemoryHarness):
        return InMemoryMessageFacts(h.memory_stream, h.memory_ledger, h.memory_dlq, h.clock)
    if isinstance(h, RedisHarness):
        return RedisMessageFacts(h.client, h.stream.stream, h.stream.group)
    assert isinstance(h, SqliteHarness)
    return SqliteMessageFacts(h.store, h.stream.stream, h.stream.group)


async def test_an_unknown_id_has_no_facts(harness: Harness) -> None:
    await harness.deliver(PAYLOAD)  # the stream exists and holds another message
    facts = await reader(harness).facts("1-0")
    assert (facts.message_id, facts.stream, facts.group) == ("1-0", *_names(harness))
    assert (facts.ledger, facts.ledger_ttl_s, facts.body_bytes) == ({}, NO_KEY_TTL, None)
    assert (facts.pending, facts.dead_letters) == (None, [])
    assert verdict(facts) is Verdict.UNKNOWN


async def test_a_read_message_is_pending_with_its_consumer_where_a_read_leases(
    harness: Harness,
) -> None:
    """On Redis a read puts the message in the group's pending list; the embedded
    broker's read only peeks (the job is leased by ``begin``, with its claims, in one
    transaction), so there the message is not pending until a worker begins it."""
    m = await harness.deliver(PAYLOAD)
    facts = await reader(harness).facts(m.id)
    assert facts.body_bytes == len(PAYLOAD)
    assert (facts.ledger, facts.ledger_ttl_s) == ({}, NO_KEY_TTL)
    if isinstance(harness, SqliteHarness):
        assert facts.pending is None
        assert verdict(facts) is Verdict.NOT_DELIVERED
        return
    assert facts.pending is not None
    assert (facts.pending["consumer"], facts.pending["deliveries"]) == ("worker-1", 1)
    assert facts.pending["idle_ms"] >= 0
    assert verdict(facts) is Verdict.NOT_CLASSIFIED


async def test_a_begun_message_is_pending_on_every_broker(harness: Harness) -> None:
    m = await harness.deliver(PAYLOAD)
    await begin(harness, m.id, "t1")
    facts = await reader(harness).facts(m.id)
    assert facts.pending is not None
    assert (facts.pending["consumer"], facts.pending["deliveries"]) == ("worker-1", 1)


async def test_a_claim_and_a_failed_attempt_read_as_the_ledger_wrote_them(
    harness: Harness,
) -> None:
    m = await harness.deliver(PAYLOAD)
    await begin(harness, m.id, "t1")
    running = await reader(harness).facts(m.id)
    assert running.invocations() == [A]
    assert running.classification() is not None
    assert running.claimed_at_ms(A) is not None
    assert running.ledger_ttl_s == NO_EXPIRY_TTL  # kept while pending
    assert verdict(running) is Verdict.RUNNING
    await finish(harness, m.id, "t1", (report(A, 1, Retry(60_000), "boom"),))
    backing_off = await reader(harness).facts(m.id)
    assert backing_off.last_error(A) == "boom"
    assert verdict(backing_off) is Verdict.BACKING_OFF


async def test_a_completed_message_is_finished_and_its_ledger_expires(harness: Harness) -> None:
    m = await harness.deliver(PAYLOAD)
    await begin(harness, m.id, "t1")
    await finish(harness, m.id, "t1", (report(A, 1, Complete()),))
    facts = await reader(harness).facts(m.id)
    assert facts.pending is None
    assert facts.body_bytes == len(PAYLOAD)
    assert facts.ledger[A] == "ok"
    assert facts.ledger_ttl_s > 0
    assert verdict(facts) is Verdict.FINISHED


async def test_a_malformed_message_names_its_dead_letter(harness: Harness) -> None:
    m = await harness.deliver(b"[1, 2]")
    request = MalformedRequest(context=harness.ctx(m.id), reason="not an object", event="[1, 2]")
    await harness.ledger.dead_letter_malformed(request)
    facts = await reader(harness).facts(m.id)
    [entry] = facts.dead_letters
    assert facts.malformed_entry() == entry.id
    assert (entry.get("original_id"), entry.get("function"), entry.get("reason")) == (
        m.id, "-", "not an object",
    )
    assert verdict(facts) is Verdict.MALFORMED


def _names(h: Harness) -> tuple[str, str]:
    return h.stream.stream, h.stream.group
