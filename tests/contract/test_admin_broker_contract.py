"""The ``AdminBroker`` contract (``open_admin_broker``): what the CLI's commands
ask of the configured broker, the same on Redis and on the embedded broker's
file. No fake: the CLI and its tests use the real adapters (as ``StreamSample``);
the dead-letter store and the message facts it hands out have suites of their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from relay.adapters.admin import open_admin_broker
from relay.application.ports import AdminBroker
from relay.domain.errors import DependencyUnavailable
from relay.domain.publication import Publication
from relay.entrypoints.config import BrokerSettings, RedisSettings
from tests.contract.conftest import redis_url_for

pytestmark = pytest.mark.anyio


class Bed:
    def __init__(self, kind: str, broker: BrokerSettings, target: RedisSettings) -> None:
        self.kind, self.broker, self.target = kind, broker, target

    def open(self, *, create: bool = False, stream: str | None = None
             ) -> AbstractAsyncContextManager[AdminBroker]:
        target = self.target
        if stream is not None:
            target = RedisSettings(target.url, stream, target.group)
        return open_admin_broker(self.broker, target, create=create)


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "sqlite"])
async def bed(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Bed]:
    unique: str = request.getfixturevalue("unique") if request.param == "redis" else "t"
    if request.param == "sqlite":
        broker = BrokerSettings(kind="sqlite", path=tmp_path / "broker.sqlite3")
        yield Bed("sqlite", broker, RedisSettings("", f"{unique}-events", "relay"))
        return
    url = redis_url_for(request)
    yield Bed("redis", BrokerSettings(), RedisSettings(url, f"{unique}-events", "relay"))


async def test_the_kind_and_whether_events_carry_a_priority(bed: Bed) -> None:
    async with bed.open(create=True) as admin:
        assert (admin.kind, admin.priorities) == (bed.kind, bed.kind == "sqlite")


async def test_published_events_come_back_in_order_with_their_ids(bed: Bed) -> None:
    seen: list[list[str]] = []
    async with bed.open(create=True) as admin:
        batches = [[Publication(b'{"n": 1}'), Publication(b'{"n": 2}')], [Publication(b'{"n": 3}')]]
        await admin.publish(iter(batches), seen.append)
        appended = await admin.append(b'{"n": 4}')
        ids = [*seen[0], *seen[1], appended]
        assert [len(batch) for batch in seen] == [2, 1]
        order = [tuple(int(part) for part in i.split("-")) for i in ids]
        assert order == sorted(set(order))  # distinct, in publishing order
        assert await admin.target_problem(group=False) is None


async def test_a_stream_with_nothing_in_it_is_named_with_its_variable(bed: Bed) -> None:
    async with bed.open(create=True) as admin:
        await admin.append(b'{"n": 1}')  # the file (or server) holds another stream
    async with bed.open(stream="nothing-here") as other:
        problem = await other.target_problem(group=False)
    assert problem is not None
    assert "'nothing-here'" in problem
    assert "REDIS_STREAM" in problem


async def test_no_schedule_was_published_for_unknown_prefixes(bed: Bed) -> None:
    async with bed.open(create=True) as admin:
        await admin.append(b'{"n": 1}')
        assert await admin.latest_published(["relay.schedule:fn/h@"]) == {}
        assert await admin.dead_letters.count() == 0


async def test_a_stream_no_group_reads_gets_a_note_where_groups_exist(bed: Bed) -> None:
    async with bed.open(create=True) as admin:
        await admin.append(b'{"n": 1}')
        note = await admin.unread_note("relay")
    if bed.kind == "sqlite":  # one group per file reads every stream it holds
        assert note is None
    else:
        assert note is not None
        assert "no consumer group 'relay'" in note


async def test_reading_never_creates_the_broker_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.sqlite3"
    broker = BrokerSettings(kind="sqlite", path=missing)
    with pytest.raises(DependencyUnavailable, match="does not exist"):
        async with open_admin_broker(broker, RedisSettings("", "events", "relay")):
            pass
    assert not missing.exists()
