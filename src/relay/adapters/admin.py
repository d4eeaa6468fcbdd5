"""``open_admin_broker``: the admin (read) side of whichever broker is configured.

The one place an admin command's broker is chosen (``RELAY_BROKER``): the CLI
asks for an :class:`relay.application.ports.AdminBroker` and reads through its
ports (dead letters, message facts, a stream sample, the schedules' dedup
records), never ``if embedded`` on its own. Each broker's modules are imported
when it is opened, so a command's start-up imports one broker client at most.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import anyio

from relay.domain.errors import ConfigError, DependencyUnavailable
from relay.domain.publication import DEFAULT_DEDUP_WINDOW_NS, Publication

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from relay.adapters.sqlite.broker.store import BrokerStore
    from relay.application.ports import (
        AdminBroker,
        DeadLetterStore,
        EventPublisher,
        MessageFactsReader,
        StreamSample,
    )


class _Choice(Protocol):  # entrypoints.config.BrokerSettings, structurally
    @property
    def embedded(self) -> bool: ...

    @property
    def path(self) -> Path: ...


class _Target(Protocol):  # entrypoints.config.RedisSettings, structurally
    @property
    def url(self) -> str: ...

    @property
    def stream(self) -> str: ...

    @property
    def group(self) -> str: ...


@asynccontextmanager
async def open_admin_broker(
    broker: _Choice,
    target: _Target,
    *,
    create: bool = False,
    ping: bool = False,
    dedup_window_ns: int = DEFAULT_DEDUP_WINDOW_NS,
) -> AsyncIterator[AdminBroker]:
    """The configured broker's admin side, closed after. ``create`` lets the
    embedded broker's file be created (publishing); reading never creates it.
    ``ping`` checks a Redis server answers before anything else is sent (a
    publish names the server it cannot reach, before any event is counted).
    ``dedup_window_ns``: ``PUBLISH_DEDUP_WINDOW``, for keyed publications."""
    if broker.embedded:
        async with open_store(broker.path, create=create) as store:
            yield SqliteAdmin(store, target.stream, target.group, dedup_window_ns)
        return
    from relay.adapters.redis.admin_checks import admin_redis_client
    from relay.adapters.redis.connection import connect_redis

    redis = await connect_redis(target.url) if ping else admin_redis_client(target.url)
    try:
        yield RedisAdmin(redis, target.stream, target.group, dedup_window_ns)
    finally:
        await redis.aclose()


@asynccontextmanager
async def open_store(path: Path, *, create: bool) -> AsyncIterator[BrokerStore]:
    """The broker file, opened (and checked) in a worker thread; closed after."""
    if not create and not path.exists():  # noqa: ASYNC240 - one stat of a local file
        raise DependencyUnavailable(
            f"broker file {path} does not exist (RELAY_BROKER_PATH names it;"
            " relay start or relay publish creates it)"
        )
    from relay.adapters.sqlite.broker.store import BrokerStore
    from relay.adapters.system import SystemClock

    store = await anyio.to_thread.run_sync(BrokerStore, path, SystemClock())
    try:
        yield store
    finally:
        await anyio.to_thread.run_sync(store.close)




class RedisAdmin:
    """The admin side of a Redis stream and its consumer group."""

    kind = "redis"
    priorities = False

    def __init__(
        self, redis: Redis, stream: str, group: str,
        dedup_window_ns: int = DEFAULT_DEDUP_WINDOW_NS,
    ) -> None:
        self.redis = redis
        self.stream = stream
        self.group = group
        self._window_ns = dedup_window_ns
        self._published = 0

    @property
    def dead_letters(self) -> DeadLetterStore:
        from relay.adapters.redis.dlq_reader import RedisDeadLetterReader

        return RedisDeadLetterReader(self.redis, self.stream)

    @property
    def facts(self) -> MessageFactsReader:
        from relay.adapters.redis.message_facts import RedisMessageFacts

        return RedisMessageFacts(self.redis, self.stream, self.group)

    @property
    def sample(self) -> StreamSample:
        from relay.adapters.redis.stream_sample import RedisStreamSample

        return RedisStreamSample(self.redis, self.stream)

    async def target_problem(self, *, group: bool) -> str | None:
        from relay.adapters.redis.admin_checks import redis_target_problem

        return await redis_target_problem(self.redis, self.stream, self.group if group else None)

    @property
    def events(self) -> EventPublisher:
        from relay.adapters.redis.producer import RedisEventPublisher

        return RedisEventPublisher(self.redis, self.stream, dedup_window_ns=self._window_ns)

    async def append(self, payload: bytes) -> str:
        from redis.exceptions import RedisError

        try:
            (added,) = await self.events.append([Publication(payload)])
        except (RedisError, OSError) as exc:
            raise DependencyUnavailable(
                f"cannot append to stream {self.stream!r}: {exc}"
            ) from exc
        return added

    async def latest_published(self, prefixes: Collection[str]) -> dict[str, str]:
        from relay.adapters.redis.schedules import latest_published

        return await latest_published(self.redis, self.stream, prefixes)

    async def publish(
        self, batches: Iterable[Sequence[Publication]], done: Callable[[list[str]], None]
    ) -> None:
        """One pipelined ``append`` per batch (a stream has no priorities)."""
        from redis.exceptions import RedisError

        events = self.events
        try:
            for batch in batches:
                ids = await events.append(batch)
                done(ids)
                self._published += len(ids)
        except (RedisError, OSError) as exc:
            raise self._publish_failed(exc) from exc

    def _publish_failed(self, exc: Exception) -> DependencyUnavailable:
        # ids reported so far were appended; the batch that failed may be in part
        return DependencyUnavailable(
            f"cannot publish to Redis: {exc} ({self._published} event(s) before it were published)"
        )

    async def unread_note(self, group: str) -> str | None:
        from redis.exceptions import RedisError

        from relay.adapters.redis.admin_checks import unread_stream_note

        try:
            return await unread_stream_note(self.redis, self.stream, group)
        except (RedisError, OSError) as exc:  # part of the publish, as it always was
            raise self._publish_failed(exc) from exc


class SqliteAdmin:
    """The admin side of the embedded broker file (one group per file)."""

    kind = "sqlite"
    priorities = True

    def __init__(
        self, store: BrokerStore, stream: str, group: str,
        dedup_window_ns: int = DEFAULT_DEDUP_WINDOW_NS,
    ) -> None:
        self.store = store
        self.stream = stream
        self.group = group
        self._window_ns = dedup_window_ns

    @property
    def dead_letters(self) -> DeadLetterStore:
        from relay.adapters.sqlite.broker.dlq import SqliteDeadLetterReader

        return SqliteDeadLetterReader(self.store)

    @property
    def facts(self) -> MessageFactsReader:
        from relay.adapters.sqlite.broker.message_facts import SqliteMessageFacts

        return SqliteMessageFacts(self.store, self.stream, self.group)

    @property
    def sample(self) -> StreamSample:
        from relay.adapters.sqlite.broker.sample import SqliteStreamSample

        return SqliteStreamSample(self.store, self.stream)

    async def target_problem(self, *, group: bool) -> str | None:
        del group  # one group per file: only the stream can be wrong
        from relay.adapters.sqlite.broker.message_facts import sqlite_target_problem

        return await sqlite_target_problem(self.store, self.stream)

    @property
    def events(self) -> EventPublisher:
        from relay.adapters.sqlite.broker.producer import SqliteEventPublisher

        return SqliteEventPublisher(self.store, self.stream, dedup_window_ns=self._window_ns)

    async def append(self, payload: bytes) -> str:
        (new_id,) = await self.events.append([Publication(payload)])
        return new_id

    async def latest_published(self, prefixes: Collection[str]) -> dict[str, str]:
        from relay.adapters.sqlite.broker.schedules import latest_published

        return await latest_published(self.store, self.stream, prefixes)

    async def publish(
        self, batches: Iterable[Sequence[Publication]], done: Callable[[list[str]], None]
    ) -> None:
        """One transaction per batch, with each event's priority class."""
        events = self.events
        for batch in batches:
            done(await events.append(batch))

    async def unread_note(self, group: str) -> str | None:
        del group  # the file's one group reads every stream it holds
        return None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def check_broker(broker: _Choice, target: _Target) -> None:
    """``relay health``'s broker check, for real: a Redis PING, or the broker file
    (it must exist and open: ``PRAGMA quick_check``). Raises a ``RelayError``."""
    if broker.embedded:
        if not broker.path.exists():
            raise ConfigError(
                f"broker file {broker.path} does not exist (is a worker running here?)"
            )
        from relay.adapters.sqlite.broker.store import BrokerStore
        from relay.adapters.system import SystemClock

        store = await anyio.to_thread.run_sync(BrokerStore, broker.path, SystemClock())
        await anyio.to_thread.run_sync(store.close)
        return
    from relay.adapters.redis.connection import connect_redis

    client = await connect_redis(target.url)
    await client.aclose()


def recent_dead_letter_ids(
    broker: _Choice, target: _Target, *, limit: int, timeout_s: float
) -> list[str]:
    """The newest dead-letter ids, for shell completion: synchronous, bounded by
    ``timeout_s``, and empty (never an error) when the broker cannot answer."""
    if broker.embedded:
        sql = f"SELECT created_ms || '-' || seq FROM dlq ORDER BY seq DESC LIMIT {int(limit)}"  # noqa: S608 - a constant
        return read_only_column(broker.path, sql, timeout_s)
    import redis

    from relay.adapters.redis.keys import dlq_key

    client = redis.Redis.from_url(
        target.url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
    )
    try:
        entries = client.xrevrange(dlq_key(target.stream), count=limit) or []
        return [_text(entry_id) for entry_id, _fields in entries]
    except Exception:  # noqa: BLE001 - Redis down or refusing: nothing to offer
        return []
    finally:
        client.close()


def read_only_column(path: Path, sql: str, timeout_s: float) -> list[str]:
    """The first column of ``sql`` on the SQLite file at ``path``, opened read-only
    (reading must not create the file); empty when it cannot be read."""
    import sqlite3

    if not path.is_file():
        return []
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout_s)
        try:
            return [str(row[0]) for row in conn.execute(sql)]
        finally:
            conn.close()
    except sqlite3.Error:
        return []
