"""``relay trace MESSAGE_ID``: the life of one stream message.

Reads, never writes: what the configured broker knows about the message (its
ledger, the entry, its place among the pending messages, the dead-letter entries
it produced), through the ``MessageFactsReader`` port; the verdict is the
domain's (:mod:`relay.domain.message_facts`) and this command only renders it.
Answers "why has this event not finished?" without reading Redis by hand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from relay.domain.errors import RelayError
from relay.domain.publication import delayed_due
from relay.domain.retention import StreamId
from relay.entrypoints.cli.brokers import broker_settings
from relay.entrypoints.cli.common import fail, out
from relay.entrypoints.cli.json_output import JsonFlag, emit_json

if TYPE_CHECKING:
    from relay.domain.message_facts import MessageFacts
    from relay.entrypoints.config import BrokerSettings, RedisSettings


def delayed_or_stream_id(text: str) -> str:
    """A delayed id as it is, or the normalised stream id (else ``ValueError``)."""
    return text if delayed_due(text) is not None else str(StreamId.parse(text))


def register(app: typer.Typer) -> None:
    app.command("trace", help="Show the life of one stream message.")(trace)


def trace(
    message_id: Annotated[
        str, typer.Argument(metavar="MESSAGE_ID", help="Stream message id, e.g. 1700000000000-0.")
    ],
    as_json: JsonFlag = False,
) -> None:
    try:
        normalised = delayed_or_stream_id(message_id.strip())
    except ValueError:
        fail(f"{message_id!r} is not a stream message id (expected <milliseconds>-<sequence>,"
             " or a delayed id delayed-<milliseconds>-<n>)")
    broker, settings = broker_settings(need_group=True)
    try:
        facts = anyio.run(_facts, broker, settings, normalised)
    except RelayError as exc:
        fail(str(exc))
    if facts.message_id != normalised:  # a delayed id, moved into the stream meanwhile
        typer.echo(f"relay: note: delayed id {normalised} entered the stream as"
                   f" {facts.message_id}", err=True)
    if as_json:
        from relay.entrypoints.cli.trace_json import trace_document

        emit_json("trace", trace_document(facts))
        return
    from relay.entrypoints.cli.trace_render import render_trace

    for line in render_trace(facts):
        out(line)


async def _facts(broker: BrokerSettings, settings: RedisSettings, message_id: str) -> MessageFacts:
    from relay.adapters.admin import open_admin_broker

    async with open_admin_broker(broker, settings) as admin:
        return await admin.facts.facts(message_id)
