"""What the current catalog says about one delivered schedule occurrence.

An occurrence bypasses matching: its envelope names exactly the function and
handler to run. Before it runs, it is checked against the catalog:

- its envelope must be one Relay wrote (the id re-derives from its fields), its
  instant a real firing of the schedule's *current* cron and no older than the
  7-day publish-if-new window, else it is **invalid** and dead-lettered at once
  (someone wrote it by hand, or re-published a past one: past the window nothing
  tells it from a copy);
- a function or schedule deliberately removed makes it **obsolete**:
  acknowledged, counted, logged, never run, never dead-lettered;
- a function whose template cannot be read (or a catalog not loaded yet)
  **waits**: it may well come back, so nothing is decided;
- otherwise it **runs**, with the schedule's timeout and retries (a function
  still building keeps it pending like any event, no attempt charged).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from relay.application.registry import ActiveFunction, Catalog
from relay.domain import schedule
from relay.domain.schedule import Envelope, InvalidOccurrence
from relay.domain.template import ScheduleRule


class OccurrenceRun(msgspec.Struct, frozen=True):
    occurrence: Envelope
    function: ActiveFunction
    rule: ScheduleRule


class OccurrenceWait(msgspec.Struct, frozen=True):
    occurrence: Envelope


class OccurrenceGone(msgspec.Struct, frozen=True):
    occurrence: Envelope


OccurrencePlan = OccurrenceRun | OccurrenceWait | OccurrenceGone | InvalidOccurrence


def _envelope(event: Mapping[str, Any], now: float) -> Envelope | InvalidOccurrence:
    parsed = schedule.parse_occurrence(event)
    if isinstance(parsed, InvalidOccurrence):
        return parsed
    return schedule.beyond_dedup_window(parsed, now) or parsed


def plan_occurrence(event: Mapping[str, Any], catalog: Catalog, now: float) -> OccurrencePlan:
    parsed = _envelope(event, now)
    if isinstance(parsed, InvalidOccurrence):
        return parsed
    fn = catalog.functions.get(parsed.function)
    if fn is None:
        if parsed.function in catalog.unavailable or not catalog.complete:
            return OccurrenceWait(parsed)
        return OccurrenceGone(parsed)
    rule = next((r for r in fn.template.schedules if r.handler == parsed.handler), None)
    if rule is None:
        return OccurrenceGone(parsed)
    at = schedule.parse_instant(parsed.scheduled_at)
    if at is None or not schedule.is_firing(rule, at):
        return InvalidOccurrence(
            f"invalid schedule occurrence: {parsed.scheduled_at} is not a firing of "
            f'{parsed.function}/{parsed.handler} (cron="{rule.cron}" timezone={rule.timezone})'
        )
    return OccurrenceRun(parsed, fn, rule)
