"""The producer's ``traceparent`` on the embedded broker: stored beside the event
(its own column), read back on every delivery path, and added to a file an older
Relay created (no column yet) without touching its jobs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_the_traceparent_travels_with_its_event_on_every_delivery_path(
    tmp_path: Path,
) -> None:
    clock = FakeClock(1_800_000_000.0)
    store = BrokerStore(tmp_path / "broker.sqlite3", clock)
    try:
        publisher = SqliteEventPublisher(store, "events")
        traced = await publisher.publish([(b'{"n": 1}', None)], GOOD)
        plain = await publisher.publish([(b'{"n": 2}', None)])
        stream = SqliteEventStream(store, stream="events", group="relay", consumer="w")
        read = {m.id: m.traceparent for m in await stream.read(10, 0)}
        assert read == {traced[0]: GOOD, plain[0]: ""}
        # a lease taken (claim) and then reclaimed once idle carries it too
        leased = await store.write(lambda c, now: jobs.claim(c, now, "events", "w", 10))
        assert {m.id: m.traceparent for m, _ in leased} == read
        clock.advance(120)
        reclaimed = await stream.reclaim(60_000, 10)
        assert {m.id: m.traceparent for m in reclaimed.messages} == read
    finally:
        store.close()


async def test_a_file_without_the_column_gets_it_and_keeps_its_jobs(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL,"
        " created_ms INTEGER NOT NULL, priority INTEGER NOT NULL DEFAULT 2, payload BLOB,"
        " state TEXT NOT NULL DEFAULT 'ready' CHECK (state IN ('ready', 'leased', 'acked')),"
        " token TEXT, consumer TEXT, leased_ms INTEGER, deliveries INTEGER NOT NULL DEFAULT 0,"
        " expires_ms INTEGER);"
        "INSERT INTO jobs (stream, created_ms, payload)"
        " VALUES ('events', 1, CAST('{\"old\": 1}' AS BLOB));"
    )
    old.commit()
    old.close()
    store = BrokerStore(path, FakeClock(1_800_000_000.0))
    try:
        stream = SqliteEventStream(store, stream="events", group="relay", consumer="w")
        [message] = await stream.read(10, 0)
        assert (message.payload, message.traceparent) == (b'{"old": 1}', "")
    finally:
        store.close()
    columns = [r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(jobs)")]
    assert columns[-1] == "traceparent"


async def test_a_bad_stored_traceparent_is_ignored_not_fatal(tmp_path: Path) -> None:
    store = BrokerStore(tmp_path / "broker.sqlite3", FakeClock(1_800_000_000.0))
    try:
        # written by hand (relay publish refuses it): the job is still delivered
        await store.write(
            lambda c, now: jobs.publish(c, now, "events", b"{}", 2, traceparent="nonsense")
        )
        stream = SqliteEventStream(store, stream="events", group="relay", consumer="w")
        [message] = await stream.read(10, 0)
        assert (message.payload, message.traceparent) == (b"{}", "")
    finally:
        store.close()
