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
from dataclasses import replace
from typing import Annotated

import anyio
import typer

from relay.domain.errors import EventError, RelayError
from relay.domain.priority import InvalidPriority, priority_class
from relay.domain.publication import Publication
from relay.entrypoints.cli.brokers import broker_settings
from relay.entrypoints.cli.common import fail, out, usage
from relay.entrypoints.cli.publish_input import StdinRun, repeated
from relay.entrypoints.cli.publish_options import publish_options
from relay.entrypoints.config import (
    BrokerSettings,
    RedisSettings,
    load_dedup_window,
    load_max_event_bytes,
)


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
    traceparent: Annotated[
        str | None,
        typer.Option(
            "--traceparent",
            help="W3C trace context to send beside every event (the handler's parent span).",
        ),
    ] = None,
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
    trace = _traceparent(traceparent)
    deliver_at_ms, key = publish_options(delay, at, key, single=event is not None and count == 1)
    template = Publication(b"", priority, deliver_at_ms=deliver_at_ms, idempotency_key=key,
                           traceparent=trace or None)
    run = StdinRun(report=lambda line: typer.echo(f"relay: {line}", err=True))
    try:
        if priority is not None:
            priority_class(priority)
        limit = load_max_event_bytes(os.environ)
        settings = broker_settings()
        window_ns = load_dedup_window(os.environ)
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
    template: Publication,
    window_ns: int,
) -> None:
    from relay.adapters.admin import open_admin_broker

    published = 0

    def done(ids: list[str]) -> None:
        nonlocal published
        published += _print(ids)

    async with open_admin_broker(
        *settings, create=True, ping=True, dedup_window_ns=window_ns
    ) as admin:
        if template.priority is not None and not admin.priorities:
            typer.echo("relay: note: the Redis broker has no priority; --priority is ignored",
                       err=True)
        batched = ([replace(template, payload=p) for p in batch] for batch in batches)
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
