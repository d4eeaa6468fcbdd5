"""``relay publish``: append events to whichever broker the environment selects.

``--event '{...}'`` (``--count N`` times), or JSON lines on stdin (one event
object per line, blank lines skipped). Every event is checked first: a JSON
object of at most ``MAX_EVENT_BYTES``. On the embedded broker ``--priority``
sets the class (critical, high, normal, low); Redis has no priority, so there
it is ignored with one note on stderr. Prints each new message id.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import IO, Annotated, Final

import anyio
import typer

from relay.domain.errors import ConfigError, EventError, RelayError
from relay.domain.priority import InvalidPriority, priority_class
from relay.entrypoints.cli.brokers import broker_settings, open_store
from relay.entrypoints.cli.common import fail, out
from relay.entrypoints.cli.event_input import parse_event
from relay.entrypoints.config import (
    DEFAULT_MAX_EVENT_BYTES,
    BrokerSettings,
    RedisSettings,
    parse_event_bytes,
)

BATCH: Final = 500  # events per transaction (or per pipeline on Redis)


def register(app: typer.Typer) -> None:
    app.command("publish", help="Append events to the broker (embedded or Redis).")(publish)


def publish(
    event: Annotated[
        str | None, typer.Option("--event", help="The event, a JSON object.")
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option("--priority", help="critical, high, normal or low (embedded broker)."),
    ] = None,
    count: Annotated[int, typer.Option("--count", help="Publish the event N times.")] = 1,
) -> None:
    """Publish ``--event`` (``--count`` times) or the JSON lines on stdin."""
    if count < 1:
        fail("--count must be a positive integer")
    try:
        if priority is not None:
            priority_class(priority)
        limit = _max_event_bytes()
        settings = broker_settings()
        if priority is not None and not settings[0].embedded:
            typer.echo("relay: note: the Redis broker has no priority; --priority is ignored",
                       err=True)
        batches = _batches(event, count, sys.stdin, limit)
        anyio.run(_publish, settings, batches, priority)
    except InvalidPriority as exc:
        fail(f"--priority: {exc}")
    except RelayError as exc:
        fail(str(exc))


def _max_event_bytes() -> int:
    raw = os.environ.get("MAX_EVENT_BYTES", "").strip()
    if not raw:
        return DEFAULT_MAX_EVENT_BYTES
    try:
        return parse_event_bytes(raw)
    except ValueError:
        raise ConfigError(
            f"MAX_EVENT_BYTES={raw[:40]!r} is invalid: a size from 1 byte to 1MiB"
        ) from None


def _checked(text: str, source: str, limit: int) -> bytes:
    payload = text.strip().encode()
    if len(payload) > limit:
        raise EventError(f"{source}: event is {len(payload)} bytes, over MAX_EVENT_BYTES ({limit})")
    parse_event(text, source)
    return payload


def _batches(event: str | None, count: int, stdin: IO[str], limit: int) -> Iterator[list[bytes]]:
    """Checked payloads, ``BATCH`` at a time (stdin is read as it is published)."""
    if event is not None:
        payload = _checked(event, "--event", limit)
        for start in range(0, count, BATCH):
            yield [payload] * min(BATCH, count - start)
        return
    if stdin.isatty():
        raise EventError("no event given: pass --event '{...}' or pipe JSON lines on stdin")
    batch: list[bytes] = []
    for number, line in enumerate(stdin, start=1):
        if not line.strip():
            continue
        batch.append(_checked(line, f"stdin line {number}", limit))
        if len(batch) >= BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


async def _publish(
    settings: tuple[BrokerSettings, RedisSettings],
    batches: Iterator[list[bytes]],
    priority: str | None,
) -> None:
    broker, redis_settings = settings
    done = 0
    try:
        # each broker's client imported on its own path (docs/cli.md, Startup)
        if broker.embedded:
            from relay.adapters.sqlite.broker.producer import SqliteEventPublisher

            async with open_store(broker, create=True) as store:
                publisher = SqliteEventPublisher(store, redis_settings.stream)
                for batch in batches:
                    ids = await publisher.publish([(p, priority) for p in batch])
                    done += _print(ids)
            return
        from relay.adapters.redis.connection import connect_redis

        client = await connect_redis(redis_settings.url)
        try:
            for batch in batches:
                async with client.pipeline(transaction=False) as pipe:
                    for payload in batch:
                        pipe.xadd(redis_settings.stream, {"event": payload})
                    ids = [i.decode() if isinstance(i, bytes) else str(i)
                           for i in await pipe.execute()]
                done += _print(ids)
        finally:
            await client.aclose()
    except EventError as exc:
        if done:
            raise EventError(f"{exc} ({done} event(s) before it were published)") from exc
        raise


def _print(ids: list[str]) -> int:
    for message_id in ids:
        out(message_id)
    return len(ids)
