"""Step 1 of a delivery, pure: what the current catalog says about one message.

:class:`Planner` decodes and matches a message into an event plan, an occurrence
plan, or :class:`~relay.domain.outcome.Malformed` (anything that cannot be
decoded or classified, for whatever reason, is dead-lettered at once). It reads
the catalog and the clock and calls nothing else, so a whole read batch is
planned before one ledger call claims it (:mod:`relay.application.dispatch_claim`).

It also says what a recorded invocation the current rules no longer match is
(:meth:`Planner.replan`), and turns a plan into the ledger's ``begin`` request.
"""

from __future__ import annotations

import msgspec

from relay.application.classify import Occurrence, classify
from relay.application.occurrence_plan import OccurrenceGone, OccurrenceRun, OccurrenceWait
from relay.application.ports import CatalogSource, Clock
from relay.application.registry import Catalog
from relay.domain import classification as codec
from relay.domain import schedule
from relay.domain.execution import clamp_timeout_ns
from relay.domain.invocation import invocation_field
from relay.domain.message_outcomes import Ended
from relay.domain.outcome import (
    BeginRequest,
    ClaimRequest,
    Malformed,
    MessageContext,
    split_field,
    unique_in_order,
)
from relay.domain.schedule import Envelope
from relay.domain.template import HandlerRule, Template


class Planned(msgspec.Struct, frozen=True):
    """One invocation a message gates: what runs and where its settings come from."""

    field: str
    function: str
    rule: HandlerRule  # an event rule, or the schedule of an occurrence
    template: Template
    ready: bool
    occurrence_id: str = ""  # a schedule occurrence's (RELAY_OCCURRENCE_ID)


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """What the current catalog says about one message."""

    invocations: tuple[Planned, ...]
    functions: tuple[str, ...]  # matched now, for the classification
    released: tuple[str, ...] = ()
    waiting: bool = False  # a recorded invocation's function is unavailable
    # A schedule occurrence (matching bypassed): what its handler reads, whether
    # it must not overlap an earlier one, and how it ended when nothing runs
    # (``obsolete``, ``skipped``).
    occurrence: Envelope | None = None
    handler_input: bytes | None = None
    skip_overlap: bool = False
    ended: str = ""

    @property
    def blocked(self) -> bool:
        return self.waiting or any(not p.ready for p in self.invocations)

    @property
    def gates(self) -> tuple[str, ...]:
        return tuple(p.field for p in self.invocations)


class Planner:
    """Plans messages against the serving catalog (no I/O)."""

    def __init__(
        self, registry: CatalogSource, clock: Clock, *, max_event_bytes: int, pad_ms: int
    ) -> None:
        """``pad_ms`` is added to every claim's lease beyond its handler's timeout
        (the bounded slot wait and the lease grace)."""
        self._registry = registry
        self._clock = clock
        self._max_event_bytes = max_event_bytes
        self._pad_ms = pad_ms

    def plan(self, payload: bytes | None, *, reclaimed: bool = False) -> Plan | Malformed:
        """Decode and match; an event that cannot be decoded or classified for any
        reason (not JSON, too deep for the decoder or the matcher, ...) is malformed."""
        catalog = self._registry.current()
        matches = classify(payload, self._max_event_bytes, catalog, self._clock.now())
        if isinstance(matches, Malformed):
            return matches
        if not isinstance(matches, list):
            plan = plan_occurrence(matches)
            if plan.skip_overlap and reclaimed:
                # Skipping is decided on the first delivery only: a redelivered
                # occurrence may hold a claim or a retry of its own, which a skip
                # would acknowledge away.
                plan = msgspec.structs.replace(plan, skip_overlap=False)
            return plan
        found: dict[str, Planned] = {}
        for match in matches:
            fn = catalog.functions.get(match.function)
            field = invocation_field(match.function, match.rule.handler)
            if fn is not None and field not in found:
                found[field] = Planned(field, match.function, match.rule, fn.template, fn.ready)
        planned = tuple(found.values())
        return Plan(
            invocations=planned,
            functions=unique_in_order(p.function for p in planned),
            # A template that cannot be read might match this event: nothing is
            # acknowledged until it is fixed or its directory removed (everything
            # else still runs). Before the first scan, nothing is known yet.
            waiting=bool(catalog.unavailable) or not catalog.complete,
        )

    def replan(self, plan: Plan, unplanned: tuple[str, ...]) -> Plan:
        """Decide what each recorded, unplanned invocation is: run again (its rule
        still exists), waited for (its function is unavailable, or the catalog is
        not loaded yet), or released (deliberately removed from a valid catalog)."""
        catalog: Catalog = self._registry.current()
        extra: list[Planned] = []
        released: list[str] = []
        waiting = False
        for field in unplanned:
            function, handler = split_field(field)
            # an occurrence runs its schedule only: nothing else it recorded is rerun
            rule = None if plan.occurrence else catalog.rule(function, handler)
            fn = catalog.functions.get(function)
            if rule is not None and fn is not None:
                extra.append(Planned(field, function, rule, fn.template, fn.ready))
            elif function in catalog.unavailable or not catalog.complete:
                waiting = True
            elif fn is not None and not fn.ready:
                waiting = True  # still building: its rules are not known to be gone
            else:
                released.append(field)
        return msgspec.structs.replace(
            plan,
            invocations=plan.invocations + tuple(extra),
            released=tuple(released),
            waiting=waiting or plan.waiting,
        )

    def begin_request(self, ctx: MessageContext, plan: Plan, token: str) -> BeginRequest:
        """The ledger's ``begin`` for ``plan``: a claim per ready invocation, each
        lease covering the invocations run before it (they run one at a time)."""
        claims: list[ClaimRequest] = []
        lease = 0
        for p in plan.invocations:
            if p.ready:
                lease += clamp_timeout_ns(p.rule.timeout_ns) // 1_000_000 + self._pad_ms
                max_attempts = 1 + max(0, p.rule.retries)
                claims.append(
                    ClaimRequest(field=p.field, max_attempts=max_attempts, lease_ms=lease)
                )
        functions = plan.functions
        if plan.occurrence is not None:
            classification = plan.occurrence.occurrence_id  # never an event's class
        elif functions:
            classification = codec.matched(functions)
        else:
            # Matching nothing while the catalog is not loaded yet, or a template
            # cannot be read, is not "unmatched": the class waits (the message too).
            classification = codec.WAITING if plan.waiting else codec.UNMATCHED
        return BeginRequest(
            context=ctx,
            classification=classification,
            token=token,
            claims=tuple(claims),
            gates=plan.gates,
            released=plan.released,
            blocked=plan.blocked,
        )


def plan_occurrence(found: Occurrence) -> Plan:
    """An occurrence plans exactly its schedule's handler (see
    :mod:`relay.application.occurrence_plan`)."""
    match found:
        case OccurrenceWait(occurrence):
            return Plan(invocations=(), functions=(), occurrence=occurrence, waiting=True)
        case OccurrenceGone(occurrence):
            return Plan(invocations=(), functions=(), occurrence=occurrence, ended=Ended.OBSOLETE)
        case OccurrenceRun(occurrence, fn, rule):
            planned = Planned(
                occurrence.field, fn.name, rule, fn.template, fn.ready, occurrence.occurrence_id
            )
            return Plan(
                invocations=(planned,),
                functions=(),
                occurrence=occurrence,
                handler_input=schedule.handler_payload(occurrence),
                skip_overlap=rule.overlap == "skip",
            )
    raise AssertionError(found)


def skipped(occurrence: Envelope) -> Plan:
    """``overlap: skip`` with an earlier occurrence not terminal: nothing runs."""
    return Plan(invocations=(), functions=(), occurrence=occurrence, ended=Ended.SKIPPED)


def forged(occurrence: Envelope) -> Plan:
    """Not the entry publish-if-new appended for its occurrence: nothing runs."""
    return Plan(invocations=(), functions=(), occurrence=occurrence, ended=Ended.FORGED)
