"""In-memory fakes of the read-side ports (``MessageFactsReader``), over the
delivery fakes of ``tests/fakes.py``: what they hold, read as the real adapters
read a broker. Proven against both brokers by
``tests/contract/test_message_facts_contract.py``."""

from __future__ import annotations

from relay.domain.message_facts import (
    NO_EXPIRY_TTL,
    NO_KEY_TTL,
    DeadLetterFact,
    MessageFacts,
)
from tests.fakes import FakeClock, InMemoryDeadLetterQueue, InMemoryEventStream, InMemoryLedger


class InMemoryMessageFacts:
    """``MessageFactsReader`` over an in-memory stream, ledger and DLQ."""

    def __init__(
        self,
        stream: InMemoryEventStream,
        ledger: InMemoryLedger,
        dlq: InMemoryDeadLetterQueue,
        clock: FakeClock,
    ) -> None:
        self._stream = stream
        self._ledger = ledger
        self._dlq = dlq
        self._clock = clock

    async def facts(self, message_id: str) -> MessageFacts:
        now_ms = int(self._clock.now() * 1000)
        s = self._stream
        facts = MessageFacts(message_id, s.stream, s.group, now_ms)
        facts.ledger = dict(self._ledger.hashes.get(message_id, {}))
        if message_id in self._ledger.ttl:  # set at the acknowledgment
            facts.ledger_ttl_s = self._ledger.ttl[message_id]
        else:
            facts.ledger_ttl_s = NO_EXPIRY_TTL if facts.ledger else NO_KEY_TTL
        if message_id in s.entries:
            payload = s.entries[message_id]
            facts.body_bytes = 0 if payload is None else len(payload)
        pending = s.pending.get(message_id)
        if pending is not None:
            facts.pending = {
                "consumer": pending.consumer,
                "idle_ms": max(0, now_ms - pending.at_ms),
                "deliveries": pending.count,
            }
        facts.dead_letters = [
            DeadLetterFact(entry_id, entry.fields())
            for entry_id, entry in self._dlq.entries
            if entry.original_id == message_id
        ]
        return facts
