"""A dry run of the rules over entries already in a stream: what would they match?

``relay function match DIR --from-stream`` (or ``--from-dlq``) reads recent entries
without consuming anything and feeds them here. Each entry goes through
:func:`relay.application.classify.classify`, the dispatcher's own first step, so the
counts are the worker's: an entry the worker would dead-letter at once is *malformed*,
a schedule occurrence bypasses matching, and every other entry is matched by the same
rule index the dispatcher uses. The dry run reads no dedup record, so its
*occurrences* include copies the worker acknowledges unrun as ``forged``.

``now()`` in a pattern is evaluated at the entry's own time (when it was appended),
which is when a worker keeping up with the stream matched it; ``at`` evaluates every
entry at one instant instead. With ``explain``, each rule keeps a few of the events it
did not match, the nearest misses (fewest failing conditions) among the first
:data:`EXPLAIN_EXAMINED`, worded by the pattern's own ``explain``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import msgspec

from relay.application.classify import classify
from relay.application.registry import ActiveFunction, Catalog
from relay.domain.errors import RelayError
from relay.domain.outcome import Malformed, inspect_payload
from relay.domain.template import EventRule, Template

EXPLAIN_SAMPLES: Final = 3
"""Non-matching events shown per rule with ``--explain``."""
EXPLAIN_EXAMINED: Final = 200
"""Non-matching events per rule whose failing conditions are worded (the cost bound)."""
MALFORMED_SAMPLES: Final = 3


class StreamNotFound(RelayError):
    """The stream to sample does not exist (or its key is not a stream)."""


class SampledEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One entry read for a dry run.

    ``payload`` is the ``event`` field's bytes (``None``: the entry has none); ``at`` is
    the entry's own time in unix seconds; ``recorded`` is the reason a dead-letter
    placeholder records instead of an event (a message that was malformed when the
    worker read it: its event was never kept whole)."""

    id: str
    payload: bytes | None
    at: float
    recorded: str | None = None


class NonMatch(msgspec.Struct, frozen=True):
    """An event a rule did not match, and every condition that failed."""

    id: str
    reasons: tuple[str, ...]


class MalformedEntry(msgspec.Struct, frozen=True):
    id: str
    reason: str


class RuleCount(msgspec.Struct, frozen=True, kw_only=True):
    function: str
    handler: str
    rule: int  # position in the function's ``events``
    matched: int
    non_matches: tuple[NonMatch, ...] = ()


class DryRunReport(msgspec.Struct, frozen=True, kw_only=True):
    """What the rules would have done with the entries read (newest first)."""

    entries: int
    matched: int  # events at least one rule matched
    unmatched: int
    malformed: int
    occurrences: int  # schedule occurrences (copies included): matching is bypassed
    newest_id: str | None
    oldest_id: str | None
    rules: tuple[RuleCount, ...]
    malformed_samples: tuple[MalformedEntry, ...]


class _Rule:
    __slots__ = ("function", "matched", "rule", "rule_index", "samples", "seen")

    def __init__(self, function: str, rule_index: int, rule: EventRule) -> None:
        self.function = function
        self.rule_index = rule_index
        self.rule = rule
        self.matched = 0
        self.seen = 0  # non-matches examined for the explanation
        self.samples: list[NonMatch] = []

    def consider(self, entry_id: str, event: dict[str, object], now: float) -> bool:
        """Word why ``event`` missed; ``False`` once enough non-matches were examined."""
        self.seen += 1
        try:
            reasons = tuple(self.rule.pattern.explain(event, now))
        except RecursionError:
            reasons = ("the event is nested too deeply to explain",)
        if not reasons:  # the index and the pattern disagree: say so, never hide it
            reasons = ("matches by its pattern, yet the rule index did not select it",)
        self.samples.append(NonMatch(entry_id, reasons))
        # nearest misses first, then the order read (sort is stable)
        self.samples.sort(key=lambda sample: len(sample.reasons))
        del self.samples[EXPLAIN_SAMPLES:]
        return self.seen < EXPLAIN_EXAMINED


class DryRun:
    """Accumulates :class:`SampledEntry` values; :meth:`report` summarises them."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        max_event_bytes: int,
        at: float | None = None,
        explain: bool = False,
    ) -> None:
        self._catalog = catalog
        self._max_bytes = max_event_bytes
        self._at = at
        self._rules: dict[tuple[str, int], _Rule] = {}
        for name in sorted(catalog.functions):
            for i, rule in enumerate(catalog.functions[name].template.events):
                self._rules[name, i] = _Rule(name, i, rule)
        # the rules still collecting non-matches to explain
        self._explaining = dict(self._rules) if explain else {}
        self._entries = self._matched = self._unmatched = self._occurrences = 0
        self._malformed: list[MalformedEntry] = []
        self._malformed_count = 0
        self._newest: str | None = None
        self._oldest: str | None = None

    def add(self, entry: SampledEntry) -> None:
        self._entries += 1
        self._newest = self._newest or entry.id
        self._oldest = entry.id
        if entry.recorded is not None:
            self._add_malformed(entry.id, entry.recorded)
            return
        now = entry.at if self._at is None else self._at
        found = classify(entry.payload, self._max_bytes, self._catalog, now)
        if isinstance(found, Malformed):
            self._add_malformed(entry.id, found.reason)
            return
        if not isinstance(found, list):
            self._occurrences += 1
            return
        hit = {(m.function, m.rule_index) for m in found}
        for key in hit:
            self._rules[key].matched += 1
        if hit:
            self._matched += 1
        else:
            self._unmatched += 1
        if self._explaining and not self._explaining.keys() <= hit:
            event = inspect_payload(entry.payload, self._max_bytes)
            assert isinstance(event, dict)  # classify decoded it just now
            for key, rule in list(self._explaining.items()):
                if key not in hit and not rule.consider(entry.id, event, now):
                    del self._explaining[key]  # examined enough non-matches

    def _add_malformed(self, entry_id: str, reason: str) -> None:
        self._malformed_count += 1
        if len(self._malformed) < MALFORMED_SAMPLES:
            self._malformed.append(MalformedEntry(entry_id, reason))

    def report(self) -> DryRunReport:
        return DryRunReport(
            entries=self._entries,
            matched=self._matched,
            unmatched=self._unmatched,
            malformed=self._malformed_count,
            occurrences=self._occurrences,
            newest_id=self._newest,
            oldest_id=self._oldest,
            rules=tuple(
                RuleCount(
                    function=r.function,
                    handler=r.rule.handler,
                    rule=r.rule_index,
                    matched=r.matched,
                    non_matches=tuple(r.samples),
                )
                for r in self._rules.values()
            ),
            malformed_samples=tuple(self._malformed),
        )


def dry_run_catalog(templates: Mapping[str, Template], unavailable: Iterable[str]) -> Catalog:
    """The catalog a worker would hold once it scanned a functions directory with these
    valid templates (every function ready) and these invalid ones."""
    functions = {
        name: ActiveFunction(
            name=name,
            directory=name,
            template=template,
            runtime=template.runtime,
            image="dry-run",
            fingerprint=None,
            prepared_at=None,
        )
        for name, template in templates.items()
    }
    return Catalog.of(functions, unavailable=frozenset(unavailable), complete=True)
