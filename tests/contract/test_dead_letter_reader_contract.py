"""The ``DeadLetterStore`` port's contract (list, get, delete, discard, count, trim),
on the in-memory fake, on Redis and on the embedded broker's file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio

from relay.adapters.redis.dlq_reader import RedisDeadLetterReader
from relay.adapters.redis.keys import dlq_key
from relay.adapters.sqlite.broker.dlq import SqliteDeadLetterReader
from relay.adapters.sqlite.broker.ledger import insert_dead_letter
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock
from relay.application.ports import DeadLetterStore
from relay.domain.dead_letters import DeadLetterNotFound, InvalidEntryId
from relay.domain.outcome import DeadLetterEntry
from tests.contract.conftest import redis_url_for
from tests.fakes import InMemoryDeadLetterQueue, InMemoryDeadLetterReader

pytestmark = pytest.mark.anyio

T0 = 1_900_000_000_000  # ms


class Bed:
    reader: DeadLetterStore

    async def write(self, entry: DeadLetterEntry, at_ms: int) -> str:
        """One entry as the ledger writes it, at ``at_ms``; its id."""
        raise NotImplementedError


class MemoryBed(Bed):
    def __init__(self) -> None:
        self.dlq = InMemoryDeadLetterQueue()
        self.reader = InMemoryDeadLetterReader(self.dlq)
        self._seq = 0

    async def write(self, entry: DeadLetterEntry, at_ms: int) -> str:
        self._seq += 1
        entry_id = f"{at_ms}-{self._seq}"
        self.dlq.entries.append((entry_id, entry))
        return entry_id


class RedisBed(Bed):
    def __init__(self, client: redis.asyncio.Redis, stream: str) -> None:
        self.client = client
        self.key = dlq_key(stream)
        self.reader = RedisDeadLetterReader(client, stream)

    async def write(self, entry: DeadLetterEntry, at_ms: int) -> str:
        entry_id = await self.client.xadd(self.key, entry.fields(), id=f"{at_ms}-*")  # type: ignore[arg-type]
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


class SqliteBed(Bed):
    def __init__(self, store: BrokerStore) -> None:
        self.store = store
        self.reader = SqliteDeadLetterReader(store)

    async def write(self, entry: DeadLetterEntry, at_ms: int) -> str:
        return await self.store.write(lambda c, _: insert_dead_letter(c, at_ms, entry))


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis), "sqlite"])
async def bed(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Bed]:
    if request.param == "memory":
        yield MemoryBed()
    elif request.param == "sqlite":
        store = BrokerStore(tmp_path / "broker.sqlite3", SystemClock())
        try:
            yield SqliteBed(store)
        finally:
            store.close()
    else:
        unique: str = request.getfixturevalue("unique")
        client = redis.asyncio.Redis.from_url(redis_url_for(request), decode_responses=False)
        try:
            yield RedisBed(client, f"{unique}-events")
        finally:
            await client.aclose()


def entry(n: int, *, function: str = "fn-a", handler: str = "events.a.handler") -> DeadLetterEntry:
    return DeadLetterEntry(
        original_stream="events",
        original_id=f"{T0 - 10_000 + n}-0",
        group="relay",
        consumer="worker-1",
        event=f'{{"n": {n}, "text": "grüße"}}',
        reason="handler failed: boom" if function != "-" else "event is not valid JSON",
        function=function,
        handler=handler,
        deliveries=n,
        handler_attempts=0 if function == "-" else 3,
        timestamp="2030-03-17T17:46:40.000Z",
    )


async def five(bed: Bed) -> list[str]:
    return [await bed.write(entry(n), T0 + n * 1000) for n in range(5)]


async def test_an_empty_queue_lists_nothing(bed: Bed) -> None:
    assert await bed.reader.count() == 0
    assert await bed.reader.page() == []
    assert await bed.reader.page(newest_first=False) == []
    assert await bed.reader.trim_before(T0 * 2) == 0


async def test_an_entry_reads_back_whole(bed: Bed) -> None:
    written = entry(2)
    entry_id = await bed.write(written, T0)
    stored = await bed.reader.get(entry_id)
    assert (stored.id, stored.entry, stored.created_ms) == (entry_id, written, T0)
    assert stored.replayable
    placeholder = await bed.reader.get(await bed.write(entry(3, function="-", handler="-"), T0 + 1))
    assert not placeholder.replayable
    assert placeholder.entry.handler_attempts == 0


async def test_pages_walk_both_ways_from_past_an_id(bed: Bed) -> None:
    ids = await five(bed)
    assert await bed.reader.count() == 5
    newest = await bed.reader.page(count=2)
    assert [s.id for s in newest] == [ids[4], ids[3]]
    assert [s.id for s in await bed.reader.page(count=2, after=ids[3])] == [ids[2], ids[1]]
    oldest = await bed.reader.page(newest_first=False, count=2, after=ids[1])
    assert [s.id for s in oldest] == [ids[2], ids[3]]
    assert await bed.reader.page(count=10, after=ids[0]) == []
    assert [s.entry.deliveries for s in newest] == [4, 3]


async def test_entries_reads_every_page(bed: Bed) -> None:
    ids = await five(bed)
    walked = [s.id async for s in bed.reader.entries(newest_first=False, page_size=2)]
    assert walked == ids
    assert [s.id async for s in bed.reader.entries(page_size=5)] == ids[::-1]


async def test_get_of_an_absent_or_malformed_id(bed: Bed) -> None:
    ids = await five(bed)
    await bed.reader.discard(ids[2])
    with pytest.raises(DeadLetterNotFound, match=f"no dead-letter entry {ids[2]} in "):
        await bed.reader.get(ids[2])
    with pytest.raises(DeadLetterNotFound):
        await bed.reader.get(f"{T0 + 99_000}-7")
    with pytest.raises(InvalidEntryId, match="is not a dead-letter entry id"):
        await bed.reader.get("not-an-id")


async def test_delete_removes_exactly_one_and_raises_when_absent(bed: Bed) -> None:
    ids = await five(bed)
    await bed.reader.delete(f" {ids[1]} ")  # as typed on a command line
    assert [s.id for s in await bed.reader.page(newest_first=False)] == [
        ids[0], ids[2], ids[3], ids[4]]
    with pytest.raises(DeadLetterNotFound, match=f"no dead-letter entry {ids[1]} in "):
        await bed.reader.delete(ids[1])
    with pytest.raises(InvalidEntryId):
        await bed.reader.delete("12-x")
    assert await bed.reader.count() == 4


async def test_discard_says_whether_this_call_removed_it(bed: Bed) -> None:
    ids = await five(bed)
    assert await bed.reader.discard(ids[0]) is True
    assert await bed.reader.discard(ids[0]) is False
    assert await bed.reader.count() == 4


async def test_trim_before_removes_exactly_the_older_entries(bed: Bed) -> None:
    ids = await five(bed)
    assert await bed.reader.trim_before(T0 + 2000) == 2  # entries at T0 and T0+1000
    assert [s.id for s in await bed.reader.page(newest_first=False)] == ids[2:]
    assert await bed.reader.trim_before(T0 + 2000) == 0
    assert await bed.reader.trim_before(-5) == 0
    assert await bed.reader.count() == 3
