"""The fixtures the embedded broker's integration tests share: a fresh broker file
per test (``path``), its frozen clock (``clock``; a module that needs another start
defines its own ``clock`` and does not import this one) and the open store on it
(``store``), plus a consumer on it (:func:`stream_on`).

A test module imports the fixtures it uses (``# noqa: F401 - fixtures``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.broker.stream import SqliteEventStream
from tests.fakes import FakeClock


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "broker.sqlite3"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(path: Path, clock: FakeClock) -> Iterator[BrokerStore]:
    s = BrokerStore(path, clock)
    yield s
    s.close()


def stream_on(store: BrokerStore, consumer: str = "worker-1") -> SqliteEventStream:
    """A consumer of the file's ``events`` stream (group ``relay``)."""
    return SqliteEventStream(store, stream="events", group="relay", consumer=consumer)
