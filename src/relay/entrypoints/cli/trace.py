"""``relay trace MESSAGE_ID``: the life of one stream message.

Reads, never writes: the message's ledger hash
(``relay:invocation:{stream}:{group}:{id}``), the entry itself, its place in the
group's pending list (``XPENDING``), and the dead-letter entries it produced.
Answers "why has this event not finished?" without reading Redis by hand.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import typer

from relay.domain.durations import MILLISECOND, format_duration
from relay.domain.errors import ConfigError, DependencyUnavailable, RelayError
from relay.domain.invocation import (
    BackingOff,
    Exhausted,
    Marker,
    Ok,
    Running,
    claimed_at_field,
    parse_marker,
)
from relay.domain.ledger_rules import parse_claim_stamp, parse_class_stamp
from relay.domain.publication import delayed_due
from relay.domain.retention import StreamId
from relay.domain.schedule import ID_PREFIX
from relay.entrypoints.cli.common import fail, out
from relay.entrypoints.cli.json_output import JsonFlag, emit_json
from relay.entrypoints.config import BrokerSettings, RedisSettings, load_broker_settings

if TYPE_CHECKING:  # redis is imported by the Redis path only (relay --help needs none)
    from redis.asyncio import Redis

DLQ_SCAN_LIMIT = 10_000  # DLQ entries examined (from the message's time on) per trace
_PAGE = 500


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
    try:
        broker, settings = load_broker_settings(os.environ)
    except RelayError as exc:
        fail("; ".join(str(exc).splitlines()))
    try:
        if broker.embedded:
            facts = anyio.run(_gather_embedded, broker, settings, normalised)
        else:
            facts = anyio.run(_gather_with_client, settings, normalised)
    except RelayError as exc:
        fail(str(exc))
    if as_json:
        from relay.entrypoints.cli.trace_json import trace_document

        emit_json("trace", trace_document(facts))
        return
    for line in render_trace(facts):
        out(line)


@dataclass(frozen=True)
class DeadLetter:
    """The fields of one DLQ entry a trace shows."""

    id: str
    fields: Mapping[str, str]

    def get(self, name: str) -> str:
        return self.fields.get(name, "")


@dataclass
class MessageFacts:
    """Everything Redis knows about one message, read at ``now_ms`` (server clock)."""

    message_id: str
    stream: str
    group: str
    now_ms: int
    ledger: dict[str, str] = field(default_factory=dict)
    ledger_ttl_s: int = -2  # Redis TTL: -2 no key, -1 no expiry
    body_bytes: int | None = None  # None: the entry is gone (trimmed or deleted)
    pending: dict[str, Any] | None = None  # consumer, idle ms, deliveries
    dead_letters: list[DeadLetter] = field(default_factory=list)
    dlq_scan_complete: bool = True
    delayed_until_ms: int | None = None  # a delayed event not due yet (docs/producing.md)


async def _gather_with_client(settings: RedisSettings, message_id: str) -> MessageFacts:
    from redis.exceptions import RedisError

    from relay.entrypoints.cli.brokers import redis_client, redis_target_problem

    redis = redis_client(settings.url)
    try:
        problem = await redis_target_problem(redis, settings.stream, settings.group)
        if problem is not None:  # a typo must not read as "unknown message"
            raise ConfigError(problem)
        if delayed_due(message_id) is not None:
            from relay.entrypoints.cli.trace_delayed import gather_delayed

            return await gather_delayed(redis, settings.stream, settings.group, message_id)
        return await gather(redis, settings.stream, settings.group, message_id)
    except (RedisError, OSError) as exc:
        raise DependencyUnavailable(f"cannot read from Redis: {exc}") from exc
    finally:
        await redis.aclose()


async def _gather_embedded(
    broker: BrokerSettings, settings: RedisSettings, message_id: str
) -> MessageFacts:
    from relay.entrypoints.cli.brokers import open_store, sqlite_target_problem
    from relay.entrypoints.cli.trace_sqlite import gather_sqlite

    async with open_store(broker, create=False) as store:
        problem = await sqlite_target_problem(store, settings.stream)
        if problem is not None:
            raise ConfigError(problem)
        return await gather_sqlite(store, settings.stream, settings.group, message_id)


async def gather(redis: Redis, stream: str, group: str, message_id: str) -> MessageFacts:
    """Read every fact about ``message_id`` (read-only)."""
    from redis.exceptions import RedisError

    from relay.adapters.redis.keys import invocation_key

    seconds, micros = await redis.time()
    facts = MessageFacts(message_id, stream, group, int(seconds) * 1000 + int(micros) // 1000)
    key = invocation_key(stream, group, message_id)
    facts.ledger = {_text(k): _text(v) for k, v in (await redis.hgetall(key)).items()}
    facts.ledger_ttl_s = int(await redis.ttl(key))
    entries: Any = await redis.xrange(stream, message_id, message_id, count=1)
    if entries:
        _id, fields = entries[0]
        facts.body_bytes = sum(len(value) for value in (fields or {}).values())
    try:
        pending = await redis.xpending_range(stream, group, message_id, message_id, 1)
    except RedisError:  # no such group (or stream): nothing is pending in it
        pending = []
    if pending:
        p = pending[0]
        facts.pending = {
            "consumer": _text(p["consumer"]),
            "idle_ms": int(p["time_since_delivered"]),
            "deliveries": int(p["times_delivered"]),
        }
    facts.dead_letters, facts.dlq_scan_complete = await _dead_letters(redis, stream, message_id)
    return facts


async def _dead_letters(
    redis: Redis, stream: str, message_id: str
) -> tuple[list[DeadLetter], bool]:
    """Entries whose ``original_id`` is the message: written after it, so the scan
    starts at the message's millisecond and stops after ``DLQ_SCAN_LIMIT`` entries."""
    from relay.adapters.redis.keys import dlq_key

    key = dlq_key(stream)
    low = f"{StreamId.parse(message_id).ms}-0"
    found: list[DeadLetter] = []
    seen = 0
    while seen < DLQ_SCAN_LIMIT:
        batch: Any = await redis.xrange(key, low, "+", count=_PAGE)
        for entry_id, raw in batch:
            fields = {_text(k): _text(v) for k, v in (raw or {}).items()}
            if fields.get("original_id") == message_id:
                found.append(DeadLetter(_text(entry_id), fields))
        seen += len(batch)
        if len(batch) < _PAGE:
            return found, True
        low = "(" + _text(batch[-1][0])
    return found, False


# --- rendering (pure) ----------------------------------------------------------
def render_trace(facts: MessageFacts) -> list[str]:
    lines = [
        f"Message:      {facts.message_id} (stream {facts.stream}, group {facts.group})",
        f"Event:        {_body(facts)}",
        *([] if facts.delayed_until_ms is None else [f"Delayed:      {_delayed(facts)}"]),
        f"Pending:      {_pending(facts)}",
        f"Classified:   {_classified(facts.ledger)}",
        f"Ledger:       {_ledger(facts)}",
    ]
    if "@dlq" in facts.ledger:
        lines.append(f"Malformed:    dead-lettered at once as entry {facts.ledger['@dlq']}")
    invocations = sorted(k for k in facts.ledger if not k.startswith("@"))
    if invocations:
        lines.append("Invocations:")
        width = max(len(name) for name in invocations)
        for name in invocations:
            claimed_at = parse_claim_stamp(facts.ledger.get(claimed_at_field(name)))[0]
            state = describe_marker(facts.ledger[name], facts.now_ms, claimed_at)
            lines.append(f"  {name:<{width}}  {state}")
            reason = facts.ledger.get(f"@err:{name}")
            if reason:
                lines.append(f"  {'':<{width}}  last error: {reason}")
    lines += _dlq_lines(facts)
    lines.append(f"Verdict:      {verdict(facts)}")
    return lines


def describe_marker(text: str, now_ms: int, claimed_at_ms: int | None = None) -> str:
    """One invocation's state, attempt and timing, in words.

    ``claimed_at_ms`` (the ledger's ``@at:<field>``, server clock) is when the
    current claim was taken: a running invocation shows it as its token age.
    """
    marker = parse_marker(text)
    match marker:
        case Ok():
            return "completed"
        case Running(deadline_ms, attempt, token):
            left = deadline_ms - now_ms
            until = (
                f"protected for {_ms(left)} more"
                if left > 0
                else f"claim expired {_ms(-left)} ago (its worker died or stalled)"
            )
            age = ""
            if claimed_at_ms is not None:  # the token age
                age = f"claimed {_ms(max(0, now_ms - claimed_at_ms))} ago, "
            return f"running attempt {attempt} (claim {token[:8]}), {age}{until}"
        case BackingOff(deadline_ms, attempt):
            left = deadline_ms - now_ms
            when = f"in {_ms(left)}" if left > 0 else f"due since {_ms(-left)}"
            return f"attempt {attempt} failed; next attempt at {_stamp(deadline_ms)} ({when})"
        case Exhausted(attempt, dead_lettered):
            written = "its DLQ entry is written" if dead_lettered else "DLQ entry NOT written yet"
            return f"exhausted after {attempt} attempt{'s' if attempt != 1 else ''}; {written}"
    return f"unreadable marker {text!r} (treated as eligible: runs at the next delivery)"


def verdict(facts: MessageFacts) -> str:
    """The short answer to "why has this event not finished?"."""
    return verdict_of(facts)[1]


def verdict_of(facts: MessageFacts) -> tuple[str, str]:  # noqa: PLR0911 - one answer per situation
    """``(code, text)``: a stable snake_case code for scripts (``--json``) and the words."""
    markers = [parse_marker(v) for k, v in facts.ledger.items() if not k.startswith("@")]
    if facts.delayed_until_ms is not None:
        return "delayed", f"delayed: deliverable from {_stamp(facts.delayed_until_ms)}, not before"
    if "@dlq" in facts.ledger:
        return "malformed", (
            "malformed (not a JSON object event, or too large): dead-lettered without running"
        )
    if facts.pending is None:
        if facts.ledger and not markers and _occurrence(facts.ledger):
            return "acknowledged_without_run", (
                "finished: acknowledged without a run (obsolete: its schedule was removed,"
                " skipped: overlap: skip, or forged: a copy of the entry publish-if-new"
                " appended; the worker's log says which)"
            )
        if facts.ledger:
            return "finished", (
                "finished: acknowledged (the ledger is kept for inspection until it expires)"
            )
        if facts.body_bytes is None:
            return "unknown", (
                "unknown: no such entry, no ledger and not pending (wrong id, or long gone)"
            )
        return "not_delivered", "not delivered yet, or acknowledged before its ledger expired"
    if facts.body_bytes is None:
        return "body_gone", (
            "pending but its body is gone (trimmed): it will be dropped without running"
        )
    if not facts.ledger:
        return "not_classified", (
            "pending and not classified yet: waiting for a worker (or Redis errors on claim)"
        )
    if any(isinstance(m, BackingOff) for m in markers):
        return "backing_off", (
            "waiting out a retry backoff; recovery redelivers it after the deadline"
        )
    if any(isinstance(m, Running) and m.deadline_ms > facts.now_ms for m in markers):
        return "running", (
            "an attempt is running (or its worker died and the claim has not expired yet)"
        )
    if any(isinstance(m, Exhausted) and not m.dead_lettered for m in markers):
        return "dlq_write_pending", (
            "exhausted but the DLQ write has not succeeded yet; recovery retries it"
        )
    if _all_settled(facts.ledger, markers):
        return "ack_missing", (
            "every invocation is finished but the acknowledgment failed (the worker's log says"
            " ledger_unavailable); recovery redelivers it and it is acknowledged, nothing runs"
            " again"
        )
    return "pending", (
        "pending; the recovery loop will redeliver it (idle entries are reclaimed every 1m)"
    )


def _all_settled(ledger: Mapping[str, str], markers: list[Marker | None]) -> bool:
    """Every matched function has an invocation and each one is completed or
    dead-lettered: what gates the XACK is done, only the XACK is missing."""
    matched = parse_class_stamp(ledger.get("@class"))[0] or ""
    if markers and _occurrence(ledger):  # exactly its schedule's invocation gates it
        return all(
            isinstance(m, Ok) or (isinstance(m, Exhausted) and m.dead_lettered) for m in markers
        )
    if not markers or not matched.startswith("matched:"):
        return False
    recorded = {name.split("/", 1)[0] for name in ledger if not name.startswith("@")}
    if not set(matched.removeprefix("matched:").split(",")) <= recorded:
        return False  # a function that never ran (still building) gates the message
    return all(isinstance(m, Ok) or (isinstance(m, Exhausted) and m.dead_lettered) for m in markers)


def _delayed(facts: MessageFacts) -> str:
    assert facts.delayed_until_ms is not None
    left = facts.delayed_until_ms - facts.now_ms
    return f"until {_stamp(facts.delayed_until_ms)} (in {_ms(max(0, left))}; not in the queue yet)"


def delayed_or_stream_id(text: str) -> str:
    """A delayed id as it is, or the normalised stream id (else ``ValueError``)."""
    return text if delayed_due(text) is not None else str(StreamId.parse(text))


def _body(facts: MessageFacts) -> str:
    if facts.body_bytes is None:
        return "gone (trimmed or deleted from the stream)"
    return f"present ({facts.body_bytes} bytes)"


def _pending(facts: MessageFacts) -> str:
    if facts.pending is None:
        return "no (acknowledged, or never delivered to this group)"
    p = facts.pending
    times = "time" if p["deliveries"] == 1 else "times"
    return (
        f"yes, with consumer {p['consumer']} (idle {_ms(p['idle_ms'])}, "
        f"delivered {p['deliveries']} {times})"
    )


def _classified(ledger: Mapping[str, str]) -> str:
    value = parse_class_stamp(ledger.get("@class"))[0]
    if value is None:
        return "not yet"
    if value.startswith("matched:"):
        return "matched: " + ", ".join(value.removeprefix("matched:").split(","))
    if value.startswith(ID_PREFIX):
        return f"schedule occurrence {value} (matching bypassed)"
    return value


def _occurrence(ledger: Mapping[str, str]) -> bool:
    """A schedule occurrence's classification is its occurrence id."""
    return (parse_class_stamp(ledger.get("@class"))[0] or "").startswith(ID_PREFIX)


def _ledger(facts: MessageFacts) -> str:
    if facts.ledger_ttl_s == -2:
        return "none"
    if facts.ledger_ttl_s == -1:
        return "kept while the message is pending (no expiry)"
    return f"expires in {_ms(facts.ledger_ttl_s * 1000)}"


def _dlq_lines(facts: MessageFacts) -> list[str]:
    if not facts.dead_letters:
        scanned = "" if facts.dlq_scan_complete else f" in the first {DLQ_SCAN_LIMIT} examined"
        return [f"Dead letters: none{scanned}"]
    lines = ["Dead letters:"]
    for e in facts.dead_letters:
        lines.append(
            f"  {e.id}  {e.get('function')}/{e.get('handler')}  "
            f"attempts={e.get('handler_attempts')} deliveries={e.get('deliveries')}  "
            f"{e.get('reason')}"
        )
    return lines


def _ms(ms: int) -> str:
    return format_duration((ms // 1000) * 1000 * MILLISECOND) if ms >= 1000 else f"{ms}ms"


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _stamp(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
