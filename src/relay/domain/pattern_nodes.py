"""The compiled form of a pattern: one node per field, one atom per operand.

Built by :func:`relay.domain.patterns.compile_pattern`; nothing here validates input.
``test`` is the matching hot path; ``why``/``explain`` word a failure for users.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from relay.domain.pattern_values import (
    COMPARISONS,
    EqualityCondition,
    equality_key,
    field_path,
    format_instant,
    is_number,
    parse_rfc3339,
    show,
    show_list,
)

# --- atoms: one operand of one operator ------------------------------------------


class Atom:
    """One operand of one operator; holds when the field's value satisfies it."""

    __slots__ = ()

    def test(self, present: bool, value: object, now: float) -> bool:
        raise NotImplementedError

    def why(self, present: bool, value: object, now: float) -> str:
        raise NotImplementedError


class EqualsAtom(Atom):
    __slots__ = ("keys", "values")

    def __init__(self, values: tuple[object, ...]) -> None:
        self.values = values
        self.keys = frozenset(equality_key(v) for v in values)

    def test(self, present: bool, value: object, now: float) -> bool:
        return present and equality_key(value) in self.keys

    def why(self, present: bool, value: object, now: float) -> str:
        if not present:
            return f"missing (expected one of {show_list(self.values)})"
        return f"{show(value)} is not one of {show_list(self.values)}"


class AffixAtom(Atom):
    __slots__ = ("affixes", "prefix")

    def __init__(self, affixes: tuple[str, ...], prefix: bool) -> None:
        self.affixes = affixes
        self.prefix = prefix

    def test(self, present: bool, value: object, now: float) -> bool:
        if not (present and isinstance(value, str)):
            return False
        return value.startswith(self.affixes) if self.prefix else value.endswith(self.affixes)

    def why(self, present: bool, value: object, now: float) -> str:
        if not present:
            return "missing"
        if not isinstance(value, str):
            return f"value is not a string (got {show(value)})"
        verb = "start" if self.prefix else "end"
        return f"{show(value)} does not {verb} with any of {show_list(self.affixes)}"


class ExistsAtom(Atom):
    __slots__ = ("want",)

    def __init__(self, want: bool) -> None:
        self.want = want

    def test(self, present: bool, value: object, now: float) -> bool:
        return present is self.want

    def why(self, present: bool, value: object, now: float) -> str:
        return "is missing" if self.want else f"is present (value {show(value)})"


class NumericAtom(Atom):
    __slots__ = ("cmp", "threshold", "wording")

    def __init__(self, op: str, threshold: float) -> None:
        self.cmp, self.wording, _ = COMPARISONS[op]
        self.threshold = threshold

    def test(self, present: bool, value: object, now: float) -> bool:
        if not present or not is_number(value):
            return False
        return self.cmp(value, self.threshold)  # type: ignore[arg-type]  # checked above

    def why(self, present: bool, value: object, now: float) -> str:
        if not present:
            return "missing"
        if not is_number(value):
            return f"value is not a number (got {show(value)})"
        return f"{show(value)} is not {self.wording} {show(self.threshold)}"


class TemporalAtom(Atom):
    __slots__ = ("cmp", "offset_s", "text", "wording")

    def __init__(self, op: str, offset_ns: int, text: str) -> None:
        self.cmp, _, self.wording = COMPARISONS[op]
        self.offset_s = offset_ns / 1e9
        self.text = text

    def test(self, present: bool, value: object, now: float) -> bool:
        if not present or not isinstance(value, str):
            return False
        instant = parse_rfc3339(value)
        return instant is not None and self.cmp(instant, now + self.offset_s)

    def why(self, present: bool, value: object, now: float) -> str:
        if not present:
            return "missing"
        if not isinstance(value, str) or parse_rfc3339(value) is None:
            return f"value is not an RFC3339 string (got {show(value)})"
        cutoff = format_instant(now + self.offset_s)
        return f"{show(value)} is not {self.wording} {self.text} ({cutoff})"


# --- field conditions -------------------------------------------------------------


class FieldCondition:
    """The condition on one key of a JSON object."""

    __slots__ = ("children", "equals", "groups", "key")

    def __init__(
        self,
        key: str,
        *,
        equals: EqualsAtom | None = None,
        groups: tuple[tuple[str, tuple[Atom, ...]], ...] = (),
        children: tuple[FieldCondition, ...] = (),
    ) -> None:
        self.key = key
        self.equals = equals  # a plain list
        self.groups = groups  # operator name -> its operands (all OR)
        self.children = children  # nested fields (AND)

    def test(self, container: object, now: float) -> bool:
        # The hot path of matching: events are plain dicts, so check that first and
        # fall back to the (slower) Mapping ABC only for other mappings.
        key = self.key
        if (type(container) is dict or isinstance(container, Mapping)) and key in container:
            present, value = True, container[key]
        else:
            present, value = False, None
        equals = self.equals
        if equals is not None:
            return present and equality_key(value) in equals.keys
        if self.groups:
            for _, atoms in self.groups:
                for atom in atoms:
                    if atom.test(present, value, now):
                        return True
            return False
        if not (present and (type(value) is dict or isinstance(value, Mapping))):
            value = None
        for child in self.children:  # noqa: SIM110  # a generator costs ~2x on the hot path
            if not child.test(value, now):
                return False
        return True

    def explain(self, container: object, now: float, where: str) -> Iterator[str]:
        if self.test(container, now):
            return
        here = field_path(where, self.key)
        key = self.key
        if isinstance(container, Mapping) and key in container:
            present, value = True, container[key]
        else:
            present, value = False, None
        if self.equals is not None:
            yield f"{here}: {self.equals.why(present, value, now)}"
        elif self.groups:
            reasons = [
                (name, "; ".join(atom.why(present, value, now) for atom in atoms))
                for name, atoms in self.groups
            ]
            if len(reasons) == 1:
                yield f"{here}.{reasons[0][0]}: {reasons[0][1]}"
            else:
                alternatives = "; ".join(f"{name}: {why}" for name, why in reasons)
                yield f"{here}: no alternative holds ({alternatives})"
        elif not present:
            yield f"{here}: missing (expected an object)"
        elif not isinstance(value, Mapping):
            yield f"{here}: {show(value)} is not an object"
        else:
            for child in self.children:
                yield from child.explain(value, now, here)

    def equality_paths(self, prefix: tuple[str, ...]) -> Iterator[EqualityCondition]:
        path = (*prefix, self.key)
        if self.equals is not None:
            yield path, self.equals.keys
        elif self.groups:
            if all(name == "equals" for name, _ in self.groups):
                keys: set[object] = set()
                for _, atoms in self.groups:
                    for atom in atoms:
                        assert isinstance(atom, EqualsAtom)
                        keys |= atom.keys
                yield path, frozenset(keys)
        else:
            for child in self.children:
                yield from child.equality_paths(path)
