"""When a schedule fires next, for display (``relay function inspect``,
``relay schedule ls``, text and ``--json``). A shared helper: no command module."""

from __future__ import annotations

from relay.domain import schedule
from relay.domain.template import ScheduleRule


def next_fire_text(cron: str, zone: str, now: float) -> str | None:
    """``2026-12-02T03:00:00Z (2026-12-02T04:00:00+01:00 Europe/Rome)``: the next
    firing after ``now`` in UTC and on the schedule's wall clock; ``None`` when a
    stored row cannot say (display only, never fails)."""
    try:
        rule = ScheduleRule(handler="-", cron=cron, timezone=zone)
        at = schedule.next_firing(rule, int(now))
        return f"{schedule.instant(at)} ({schedule.local_time(rule, at)} {zone})"
    except Exception:  # noqa: BLE001 - display only: a row that cannot say shows no line
        return None


def next_fire_at(cron: str, zone: str, now: float) -> str | None:
    """The next firing after ``now`` as RFC3339 UTC (``--json``); ``None`` when a
    stored row cannot say."""
    try:
        rule = ScheduleRule(handler="-", cron=cron, timezone=zone)
        return schedule.instant(schedule.next_firing(rule, int(now)))
    except Exception:  # noqa: BLE001 - display only, as next_fire_text
        return None
