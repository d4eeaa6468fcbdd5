"""``relay publish``: append events to whichever broker the environment selects.

``--event '{...}'`` (``--count N`` times), or JSON lines on stdin (one event
object per line, blank lines skipped; see ``publish_input``). Every event is
checked first: a JSON object of at most ``MAX_EVENT_BYTES``. On the embedded
broker ``--priority`` sets the class (critical, high, normal, low); Redis has no
priority, so there it is ignored with one note on stderr, and a stream no
consumer group reads yet gets one note too (the events wait for the worker that
creates it). Prints each new message id.

``--delay 10m`` or ``--at 2026-12-24T18:00:00Z`` delays every event given (a time
in the past is now; at most 365 days ahead). ``--id KEY`` publishes one
``--event`` at most once within ``PUBLISH_DEDUP_WINDOW``: a second publish of the
key adds nothing and prints the first one's id. A key names one event, so it is
refused with ``--count`` above 1 and with stdin (docs/producing.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from relay.domain.errors import ConfigError, DependencyUnavailable, EventError, RelayError
from relay.domain.priority import InvalidPriority, priority_class
from relay.domain.publication import Publication
from relay.entrypoints.cli.brokers import broker_settings
from relay.entrypoints.cli.common import fail, out, usage
from relay.entrypoints.cli.publish_input import StdinRun, repeated
from relay.entrypoints.cli.publish_options import publish_options
from relay.entrypoints.cli.publishing import driver_error, open_publisher
from relay.entrypoints.config import (
    DEFAULT_MAX_EVENT_BYTES,
    BrokerSettings,
    RedisSettings,
    load_dedup_window,
    parse_event_bytes,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis


def register(app: typer.Typer) -> None:
    app.command("publish", help="Append events to the broker (embedded or Redis).")(publish)


def publish(  # noqa: PLR0917 - a typer command: its options are its parameters
    event: Annotated[
        str | None, typer.Option("--event", help="The event, a JSON object.")
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option("--priority", help="critical, high, normal or low (embedded broker)."),
    ] = None,
    count: Annotated[int, typer.Option("--count", help="Publish the event N times.")] = 1,
    delay: Annotated[
        str | None, typer.Option("--delay", help="Deliver after this long, e.g. 10m or 2h30m.")
    ] = None,
    at: Annotated[
        str | None,
        typer.Option("--at", help="Deliver at this RFC 3339 time, e.g. 2026-12-24T18:00:00Z."),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option("--id", help="Idempotency key: publish the --event once per window."),
    ] = None,
) -> None:
    """Publish ``--event`` (``--count`` times) or the JSON lines on stdin."""
    if count < 1:
        usage(f"--count {count} is invalid: expected a positive whole number")
    deliver_at_ms, key = publish_options(delay, at, key, single=event is not None and count == 1)
    template = Publication(b"", priority, deliver_at_ms=deliver_at_ms, idempotency_key=key)
    run = StdinRun(report=lambda line: typer.echo(f"relay: {line}", err=True))
    try:
        if priority is not None:
            priority_class(priority)
        limit = _max_event_bytes()
        settings = broker_settings()
        window_ns = load_dedup_window(os.environ)
        if priority is not None and not settings[0].embedded:
            typer.echo("relay: note: the Redis broker has no priority; --priority is ignored",
                       err=True)
        batches = _batches(event, count, run, limit)
        anyio.run(_publish, settings, batches, template, window_ns)
    except InvalidPriority as exc:
        usage(f"--priority: {exc}")
    except RelayError as exc:
        fail(str(exc))
    if run.bad:  # each bad line is reported already; the summary, when it adds to them
        summary = run.summary()
        if summary is not None:
            fail(summary)
        raise typer.Exit(1)


def _batches(event: str | None, count: int, run: StdinRun, limit: int) -> Iterator[list[bytes]]:
    if event is not None:
        return repeated(event, count, limit)
    if sys.stdin.isatty():
        raise EventError("no event given: pass --event '{...}' or pipe JSON lines on stdin")
    return run.batches(sys.stdin.buffer, limit)


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


async def _publish(
    settings: tuple[BrokerSettings, RedisSettings],
    batches: Iterator[list[bytes]],
    template: Publication,
    window_ns: int,
) -> None:
    stream = settings[1].stream
    done = 0
    note = None
    async with open_publisher(
        settings, stream, create=True, dedup_window_ns=window_ns
    ) as (publisher, redis):
        try:
            for batch in batches:
                publications = [replace(template, payload=p) for p in batch]
                done += _print(await publisher.append(publications))
            if redis is not None and done:
                note = await _unread_note(redis, stream)
        except Exception as exc:
            if redis is None or not driver_error(exc):
                raise
            # ids printed so far were appended; the batch that failed may be in part
            raise DependencyUnavailable(
                f"cannot publish to Redis: {exc} ({done} event(s) before it were published)"
            ) from exc
    if note is not None:
        typer.echo(f"relay: note: {note}", err=True)


async def _unread_note(redis: Redis, stream: str) -> str | None:
    from relay.entrypoints.cli.brokers import unread_stream_note

    # publish needs no group, so the settings hold none; the note names the configured one
    return await unread_stream_note(redis, stream, os.environ.get("REDIS_GROUP", "").strip())


def _print(ids: list[str]) -> int:
    for message_id in ids:
        out(message_id)
    return len(ids)
