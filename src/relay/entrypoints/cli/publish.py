"""``relay publish``: append events to whichever broker the environment selects.

``--event '{...}'`` (``--count N`` times), or JSON lines on stdin (one event
object per line, blank lines skipped; see ``publish_input``). Every event is
checked first: a JSON object of at most ``MAX_EVENT_BYTES``. On the embedded
broker ``--priority`` sets the class (critical, high, normal, low); Redis has no
priority, so there it is ignored with one note on stderr, and a stream no
consumer group reads yet gets one note too (the events wait for the worker that
creates it). Prints each new message id.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from relay.domain.errors import EventError, RelayError
from relay.domain.priority import InvalidPriority, priority_class
from relay.domain.publication import Publication
from relay.entrypoints.cli.brokers import broker_settings
from relay.entrypoints.cli.common import fail, out, usage
from relay.entrypoints.cli.publish_input import StdinRun, repeated
from relay.entrypoints.config import BrokerSettings, RedisSettings, load_max_event_bytes

if TYPE_CHECKING:
    pass


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
    traceparent: Annotated[
        str | None,
        typer.Option(
            "--traceparent",
            help="W3C trace context to send beside every event (the handler's parent span).",
        ),
    ] = None,
) -> None:
    """Publish ``--event`` (``--count`` times) or the JSON lines on stdin."""
    if count < 1:
        usage(f"--count {count} is invalid: expected a positive whole number")
    trace = _traceparent(traceparent)
    run = StdinRun(report=lambda line: typer.echo(f"relay: {line}", err=True))
    try:
        if priority is not None:
            priority_class(priority)
        limit = load_max_event_bytes(os.environ)
        settings = broker_settings()
        batches = _batches(event, count, run, limit)
        anyio.run(_publish, settings, batches, priority, trace)
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


def _traceparent(raw: str | None) -> str:
    """The flag's value, checked: a producer's own command refuses a bad one (a
    worker reading one ignores it)."""
    if raw is None:
        return ""
    from relay.domain.traceparent import valid_traceparent

    valid = valid_traceparent(raw)
    if not valid:
        usage(
            "--traceparent is invalid: expected the W3C form"
            " 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>"
        )
    return valid


async def _publish(
    settings: tuple[BrokerSettings, RedisSettings],
    batches: Iterator[list[bytes]],
    priority: str | None,
    traceparent: str,
) -> None:
    from relay.adapters.admin import open_admin_broker

    published = 0

    def done(ids: list[str]) -> None:
        nonlocal published
        published += _print(ids)

    async with open_admin_broker(*settings, create=True, ping=True) as admin:
        if priority is not None and not admin.priorities:
            typer.echo("relay: note: the Redis broker has no priority; --priority is ignored",
                       err=True)
        batched = (
            [Publication(p, priority, traceparent=traceparent or None) for p in batch]
            for batch in batches
        )
        await admin.publish(batched, done)
        # publish needs no group, so the settings hold none; the note names the configured one
        group = os.environ.get("REDIS_GROUP", "").strip()
        note = await admin.unread_note(group) if published else None
    if note is not None:
        typer.echo(f"relay: note: {note}", err=True)


def _print(ids: list[str]) -> int:
    for message_id in ids:
        out(message_id)
    return len(ids)
