"""What one stream entry is, as the dispatcher decides it before anything runs.

:func:`classify` is the first step of :class:`relay.application.dispatch.MessageDispatcher`
(its *plan*) and the whole of ``relay function match --from-stream`` (the dry run), so a
dry run counts exactly what the worker would: the same size cap, the same decoder, the
same schedule-envelope check and the same rule index.
"""

from __future__ import annotations

from typing import Final

from relay.application.occurrence_plan import (
    OccurrenceGone,
    OccurrenceRun,
    OccurrenceWait,
    plan_occurrence,
)
from relay.application.registry import Catalog
from relay.domain import schedule
from relay.domain.outcome import Malformed, classify_failure, inspect_payload, malformed
from relay.domain.rule_index import RuleMatch
from relay.domain.schedule import InvalidOccurrence

__all__ = ["Classified", "Occurrence", "classify"]

Occurrence = OccurrenceRun | OccurrenceWait | OccurrenceGone
"""A schedule occurrence (matching bypassed) and what the catalog says of it."""

Classified = Malformed | Occurrence | list[RuleMatch]
"""Dead-letter at once, run a schedule's handler, or the matched event rules (maybe none)."""

_EMPTY: Final = b""


def classify(
    payload: bytes | None, max_event_bytes: int, catalog: Catalog, now: float
) -> Classified:
    """Decode ``payload`` and match it against ``catalog`` with ``now()`` at ``now``.

    Anything that cannot be decoded or classified, for whatever reason (missing, too
    large, not JSON, not an object, nested too deep for the decoder or the matcher, an
    occurrence Relay did not write), is :class:`Malformed`: the worker dead-letters it.
    """
    try:
        decoded = inspect_payload(payload, max_event_bytes)
        if isinstance(decoded, Malformed):
            return decoded
        if schedule.is_occurrence(decoded):
            plan = plan_occurrence(decoded, catalog, now)
            if isinstance(plan, InvalidOccurrence):
                return malformed(plan.reason, payload or _EMPTY, max_event_bytes)
            return plan
        return catalog.index.match(decoded, now)
    except Exception as exc:  # noqa: BLE001 - whatever breaks classification dead-letters it
        return classify_failure(exc, payload or _EMPTY, max_event_bytes)
