"""Match one event against every function's rules without walking every rule.

Each event rule is filed under ONE of its equality conditions (a key path and the
values allowed there); rules without any equality condition are always candidates.
Matching an event looks up the event's value at each indexed path, collects the
candidate rules, and verifies each fully, so the result is exactly that of a linear
scan: functions in name order, rules in declaration order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import msgspec

from relay.domain.patterns import equality_key, value_at
from relay.domain.template import EventRule, Template


class RuleMatch(msgspec.Struct, frozen=True):
    """One matched rule: ``rule_index`` is its position in the function's ``events``."""

    function: str
    rule_index: int
    rule: EventRule


class RuleIndex:
    """Immutable; rebuild it when the set of functions changes."""

    __slots__ = ("_always", "_by_path", "_matches")

    def __init__(
        self,
        matches: tuple[RuleMatch, ...],
        by_path: dict[tuple[str, ...], dict[object, tuple[int, ...]]],
        always: tuple[int, ...],
    ) -> None:
        self._matches = matches  # global order: function name, then declaration
        self._by_path = by_path
        self._always = always

    @classmethod
    def build(cls, functions: Iterable[tuple[str, Template]]) -> RuleIndex:
        matches: list[RuleMatch] = []
        for name, template in sorted(functions, key=lambda item: item[0]):
            for i, rule in enumerate(template.events):
                matches.append(RuleMatch(function=name, rule_index=i, rule=rule))
        conditions = [found.rule.pattern.equality_conditions() for found in matches]
        # How many rules could be filed under each (path, value): a rule goes under its
        # condition whose values are shared by the fewest rules (the most selective one).
        sharing: Counter[tuple[tuple[str, ...], object]] = Counter(
            (path, key) for conds in conditions for path, keys in conds for key in keys
        )
        by_path: dict[tuple[str, ...], dict[object, list[int]]] = {}
        always: list[int] = []
        for position, conds in enumerate(conditions):
            if not conds:
                always.append(position)
                continue
            path, keys = min(conds, key=lambda c: sum(sharing[(c[0], key)] for key in c[1]))
            table = by_path.setdefault(path, {})
            for key in keys:
                table.setdefault(key, []).append(position)
        frozen = {
            path: {key: tuple(ids) for key, ids in table.items()} for path, table in by_path.items()
        }
        return cls(tuple(matches), frozen, tuple(always))

    def __len__(self) -> int:
        return len(self._matches)

    def candidates(self, event: Mapping[str, object]) -> list[int]:
        """Positions of the rules that may match ``event``, in matching order."""
        found: set[int] = set(self._always)
        for path, table in self._by_path.items():
            present, value = value_at(event, path)
            if not present:
                continue
            key = equality_key(value)
            if key is None:
                continue
            ids = table.get(key)
            if ids:
                found.update(ids)
        return sorted(found)

    def match(self, event: Mapping[str, object], now: float) -> list[RuleMatch]:
        """Every matching rule: functions in name order, rules in declaration order."""
        matches = self._matches
        out: list[RuleMatch] = []
        for position in self.candidates(event):
            found = matches[position]
            if found.rule.pattern.matches(event, now):
                out.append(found)
        return out

    def match_linear(self, event: Mapping[str, object], now: float) -> list[RuleMatch]:
        """The same result by checking every rule (the reference, and the bench baseline)."""
        return [m for m in self._matches if m.rule.pattern.matches(event, now)]
