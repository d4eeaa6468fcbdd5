"""Schedule occurrences: their identity, their envelope, and when a cron fires.

An *occurrence* is one firing of one schedule, identified by the absolute
instant it is due (whole seconds, UTC), never by a wall-clock reading:
``schedule:<function>:<handler>:<scheduled_at>``. Every worker derives the same
id for the same firing, so one atomic publish-if-new keeps it to one stream
entry. The id's dedup key is scoped by the stream (:func:`dedup_key`), so two
deployments on one Redis with the same function and handler names never
suppress each other's occurrences.

When a cron fires is croniter's iteration in the schedule's zone, and nothing
else: :func:`firings` (what a worker publishes) and :func:`is_firing` (what a
consumer accepts) are the same iteration, so they can never disagree. Across
DST that iteration means (tested on Europe/Rome in ``tests/unit/test_schedule.py``):

- *spring forward*: a wall-clock time inside the gap never happens; a schedule
  due in the gap fires once, at the first instant after it (``30 2 * * *``
  fires at 03:00 local on that day); a schedule that also matches that first
  instant fires there only once;
- *fall back*: a wall-clock time that happens twice fires twice, once per UTC
  instant, as two distinct occurrences (``30 2 * * *`` runs at 00:30 and
  01:30 UTC on that day). A job that must run once a day whatever the zone does
  is best written in UTC.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote
from zoneinfo import ZoneInfo

import msgspec
from croniter import croniter

from relay.domain.template import ScheduleRule

SOURCE: Final = "relay.schedule"
DEDUP_TTL_S: Final = 7 * 86400
ID_PREFIX: Final = "schedule:"
DEDUP_PREFIX: Final = "relay:occurrence:"
INSTANT_LENGTH: Final = len("2026-03-29T01:00:00Z")  # the end of every occurrence id
_INSTANT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
# Bounds one evaluation: a every-second cron over a stalled minute is 60 firings.
MAX_FIRINGS: Final = 3600


class Envelope(msgspec.Struct, frozen=True):
    """The one ``event`` field of an occurrence's stream entry (field order is the
    wire order: the envelope is written byte for byte as encoded here)."""

    source: str
    function: str
    handler: str
    scheduled_at: str
    occurrence_id: str

    @property
    def field(self) -> str:
        """The invocation field of its run (``function/handler``)."""
        return f"{self.function}/{self.handler}"


class InvalidOccurrence(msgspec.Struct, frozen=True):
    """An entry that claims to be an occurrence but is not one Relay wrote."""

    reason: str


_encoder = msgspec.json.Encoder()


def instant(epoch_s: float) -> str:
    """``epoch_s`` as RFC 3339 UTC in whole seconds: ``2026-03-29T01:00:00Z``."""
    return datetime.fromtimestamp(int(epoch_s), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_instant(text: str) -> int | None:
    """The epoch seconds of an :func:`instant` text, or ``None`` for anything else."""
    if _INSTANT.fullmatch(text) is None:
        return None
    try:
        return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp())
    except ValueError:
        return None


def schedule_prefix(function: str, handler: str) -> str:
    """What every occurrence id of one schedule starts with."""
    return f"{ID_PREFIX}{function}:{handler}:"


def occurrence_id(function: str, handler: str, at_s: int) -> str:
    """``schedule:<function>:<handler>:<scheduled_at RFC 3339 UTC>``."""
    return schedule_prefix(function, handler) + instant(at_s)


def dedup_key(stream: str, occurrence: str) -> str:
    """The publish-if-new key of an occurrence id on ``stream``:
    ``relay:occurrence:<stream, percent-encoded>:schedule:...`` (the Redis key, and
    the embedded broker's ``occurrences`` row id). Encoding the stream keeps its
    ``:`` and glob characters out of the key's shape, so one ``SCAN`` pattern
    selects one stream's keys."""
    return f"{DEDUP_PREFIX}{quote(stream, safe='')}:{occurrence}"


def legacy_dedup_key(occurrence: str) -> str:
    """The key the previous layout wrote for every stream alike (``relay:`` + the
    id; the embedded broker's row id was the bare id). Publish-if-new still honours
    it, never writes it: an upgrade within its 7-day TTL never publishes an
    occurrence the previous version already did."""
    return "relay:" + occurrence


def envelope(function: str, handler: str, at_s: int) -> Envelope:
    return Envelope(
        source=SOURCE,
        function=function,
        handler=handler,
        scheduled_at=instant(at_s),
        occurrence_id=occurrence_id(function, handler, at_s),
    )


def encode(occurrence: Envelope) -> bytes:
    """The envelope as the entry's ``event`` value (compact JSON, fixed order)."""
    return _encoder.encode(occurrence)


def handler_payload(occurrence: Envelope) -> bytes:
    """What the handler receives on stdin, exactly."""
    return _encoder.encode({"source": SOURCE, "scheduled_at": occurrence.scheduled_at})


def is_occurrence(event: Mapping[str, Any]) -> bool:
    """Whether a decoded event claims to be a schedule occurrence."""
    return event.get("source") == SOURCE


def occurrence_id_in(payload: bytes | str | None) -> str | None:
    """The occurrence id a stream entry's ``event`` payload carries, or ``None`` when
    it is not (valid JSON holding) an occurrence Relay wrote."""
    if payload is None:
        return None
    try:
        event = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return None
    if not isinstance(event, dict) or not is_occurrence(event):
        return None
    parsed = parse_occurrence(event)
    return parsed.occurrence_id if isinstance(parsed, Envelope) else None


def parse_occurrence(event: Mapping[str, Any]) -> Envelope | InvalidOccurrence:
    """The envelope of an event claiming ``source: relay.schedule``, or why it is not
    one Relay wrote (a missing field, a malformed instant, an id that does not
    re-derive from its fields)."""
    values: dict[str, str] = {}
    for name in ("function", "handler", "scheduled_at", "occurrence_id"):
        value = event.get(name)
        if not isinstance(value, str) or not value:
            return InvalidOccurrence(f"invalid schedule occurrence: {name} is missing")
        values[name] = value
    extra = sorted(set(event) - {"source", *values})
    if extra:
        return InvalidOccurrence(f"invalid schedule occurrence: unexpected field {extra[0]}")
    at = parse_instant(values["scheduled_at"])
    if at is None:
        return InvalidOccurrence(
            "invalid schedule occurrence: scheduled_at is not an RFC 3339 UTC instant"
        )
    expected = occurrence_id(values["function"], values["handler"], at)
    if values["occurrence_id"] != expected:
        return InvalidOccurrence(
            "invalid schedule occurrence: occurrence_id does not match its fields"
        )
    return Envelope(source=SOURCE, **values)


def beyond_dedup_window(occurrence: Envelope, now_s: float) -> InvalidOccurrence | None:
    """Why an occurrence due more than :data:`DEDUP_TTL_S` before ``now_s`` is not run:
    its publish-if-new record has expired, so nothing can tell it from a copy written
    by hand (or re-published), and running it would run a past occurrence again.
    ``None`` within the window."""
    at = parse_instant(occurrence.scheduled_at)
    if at is None or now_s - at <= DEDUP_TTL_S:
        return None
    return InvalidOccurrence(
        f"invalid schedule occurrence: {occurrence.scheduled_at} is older than the "
        f"{DEDUP_TTL_S // 86400}-day publish-if-new window (a copy, or delivered too late "
        "to tell from one): not run"
    )


FORGED_REASON: Final = (
    "a copy of a schedule occurrence: publish-if-new appended another entry for it "
    "(or none): not run"
)


def is_copy(recorded: str | None, message_id: str) -> bool:
    """Whether the delivered entry ``message_id`` is not the one publish-if-new
    appended for its occurrence. ``recorded`` is what the dedup record names:
    the appended entry's id, ``""`` for a record of the previous layout (it names
    no entry, so it counts as this one: an upgrade never drops a genuine
    occurrence), ``None`` for no record at all (nothing was published: a copy)."""
    return recorded is None or recorded not in {"", message_id}


# --- when a cron fires --------------------------------------------------------------


def _iterator(rule: ScheduleRule, after_s: int) -> croniter:
    start = datetime.fromtimestamp(after_s, tz=ZoneInfo(rule.timezone))
    return croniter(rule.cron, start, second_at_beginning=rule.has_seconds)


def firings(rule: ScheduleRule, after_s: int, until_s: int) -> list[int]:
    """Every instant (epoch seconds) the schedule fires in ``(after_s, until_s]``,
    at most :data:`MAX_FIRINGS` (the latest are kept)."""
    out: list[int] = []
    if until_s <= after_s:
        return out
    it = _iterator(rule, after_s)
    while True:
        at = int(it.get_next(float))
        if at > until_s:
            return out[-MAX_FIRINGS:]
        out.append(at)
        if len(out) > 2 * MAX_FIRINGS:
            del out[:MAX_FIRINGS]


def next_firing(rule: ScheduleRule, after_s: int) -> int:
    """The first instant the schedule fires after ``after_s``."""
    return int(_iterator(rule, after_s).get_next(float))


def is_firing(rule: ScheduleRule, at_s: int) -> bool:
    """Whether ``at_s`` is a real firing of the schedule's current cron."""
    return next_firing(rule, at_s - 1) == at_s


def latest_firing(rule: ScheduleRule, now_s: int, window_s: int) -> int | None:
    """The latest firing in ``[now_s - window_s, now_s]`` (never a future one)."""
    if window_s <= 0:
        return None
    start = datetime.fromtimestamp(now_s + 1, tz=ZoneInfo(rule.timezone))
    at = int(croniter(rule.cron, start, second_at_beginning=rule.has_seconds).get_prev(float))
    if now_s - window_s <= at <= now_s and is_firing(rule, at):
        return at
    # croniter's backward step around a DST change may differ from its forward
    # one: the forward iteration is the definition, so ask it (rare, bounded).
    found = firings(rule, now_s - window_s - 1, now_s)
    return found[-1] if found else None


def local_time(rule: ScheduleRule, at_s: int) -> str:
    """``at_s`` on the schedule's wall clock: ``2026-03-29T03:00:00+02:00``."""
    return datetime.fromtimestamp(at_s, tz=ZoneInfo(rule.timezone)).isoformat()
