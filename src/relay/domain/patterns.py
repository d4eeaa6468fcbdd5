"""The pattern language: compile a template's ``pattern`` once, match events fast.

A pattern is a map of field conditions. Each field's condition is one of:

* a list: equality with any listed value (type preserving, see :func:`equality_key`);
* a map whose keys are all operators (``equals``, ``prefix``, ``suffix``, ``exists``,
  ``gt``, ``gte``, ``lt``, ``lte``): the field matches when ANY operator holds;
* a map without operator keys: nested field conditions on the value (a JSON object).

Sibling fields are AND; values in one list are OR; several operators on a field are OR.
Everything else is rejected when the pattern is compiled, with the location of every
problem, so a rule can never be silently dead.

Matching never raises, whatever JSON value the event holds.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping
from datetime import date
from typing import Final

from relay.domain.durations import DurationError, parse_duration
from relay.domain.errors import TemplateError
from relay.domain.pattern_nodes import (
    AffixAtom,
    Atom,
    EqualsAtom,
    ExistsAtom,
    FieldCondition,
    NumericAtom,
    TemporalAtom,
)
from relay.domain.pattern_values import (
    OPERATOR_SET,
    OPERATORS,
    EqualityCondition,
    equality_key,
    field_path,
    is_number,
    is_scalar,
    parse_rfc3339,
    show,
    value_at,
)

__all__ = [
    "OPERATORS",
    "CompiledPattern",
    "EqualityCondition",
    "compile_pattern",
    "equality_key",
    "parse_rfc3339",
    "show",
    "value_at",
]

MAX_PATTERN_DEPTH: Final = 32
_LONG_OPERATORS: Final = ("equals", "prefix", "suffix", "exists")
_NOW = re.compile(r"now\(\)(?:([+-])(.*))?", re.DOTALL)
_OLD_NOW = re.compile(r"now(?:\s*[+-].*)?", re.DOTALL | re.IGNORECASE)


class CompiledPattern:
    """A pattern compiled for matching. Build it with :func:`compile_pattern`."""

    __slots__ = ("_canonical", "_fields", "raw")

    def __init__(self, fields: tuple[FieldCondition, ...], raw: Mapping[str, object]) -> None:
        self._fields = fields
        self.raw = raw
        self._canonical = json.dumps(raw, sort_keys=True, default=repr)

    def matches(self, event: Mapping[str, object], now: float) -> bool:
        """Whether ``event`` satisfies every field condition; ``now`` is unix seconds."""
        for field in self._fields:  # noqa: SIM110  # a generator costs ~2x on the hot path
            if not field.test(event, now):
                return False
        return True

    def explain(self, event: Mapping[str, object], now: float) -> list[str]:
        """Every failing condition, one line each; empty when the event matches."""
        lines: list[str] = []
        for field in self._fields:
            lines.extend(field.explain(event, now, "pattern"))
        return lines

    def equality_conditions(self) -> list[EqualityCondition]:
        """The equality-only conditions every match must satisfy: (key path, allowed
        :func:`equality_key` values). The rule index looks candidates up by these."""
        out: list[EqualityCondition] = []
        for field in self._fields:
            out.extend(field.equality_paths(()))
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CompiledPattern) and other._canonical == self._canonical

    def __hash__(self) -> int:
        return hash(self._canonical)

    def __repr__(self) -> str:
        return f"CompiledPattern({self._canonical})"


# --- compiling --------------------------------------------------------------------


def compile_pattern(raw: object, where: str = "pattern") -> CompiledPattern:
    """Compile a pattern, raising :class:`TemplateError` listing every problem."""
    problems: list[str] = []
    if not isinstance(raw, Mapping):
        raise TemplateError([f"{where}: must be a map of field conditions (got {show(raw)})"])
    fields = _compile_fields(raw, where, problems, depth=1)
    if problems:
        raise TemplateError(problems)
    return CompiledPattern(fields, raw)


def _compile_fields(
    raw: Mapping[object, object], where: str, problems: list[str], depth: int
) -> tuple[FieldCondition, ...]:
    if depth > MAX_PATTERN_DEPTH:
        problems.append(f"{where}: nested deeper than {MAX_PATTERN_DEPTH} levels")
        return ()
    if not raw:
        problems.append(f"{where}: must contain at least one field condition")
        return ()
    fields: list[FieldCondition] = []
    for key, value in raw.items():
        if not isinstance(key, str):
            problems.append(
                f"{where}: field name {show(key)} must be a string "
                "(quote it in YAML: bare yes/no/on/off/true/false and numbers are not strings)"
            )
            continue
        field = _compile_field(key, value, field_path(where, key), problems, depth)
        if field is not None:
            fields.append(field)
    return tuple(fields)


def _compile_field(
    key: str, value: object, here: str, problems: list[str], depth: int
) -> FieldCondition | None:
    if isinstance(value, list | tuple):
        values = _scalars(value, here, problems)
        return FieldCondition(key, equals=EqualsAtom(values)) if values is not None else None
    if isinstance(value, Mapping):
        names = [k for k in value if isinstance(k, str) and k in OPERATOR_SET]
        if not names:
            if _misspelled_operators(value, here, problems):
                return None
            children = _compile_fields(value, here, problems, depth + 1)
            return FieldCondition(key, children=children) if children else None
        unknown = [k for k in value if k not in OPERATOR_SET]
        for k in unknown:
            problems.append(
                f"{here}: unknown operator {show(k)} next to {', '.join(names)} "
                f"(operators are {', '.join(OPERATORS)}; a map cannot mix operators and fields)"
            )
        groups = []
        for name in names:
            atoms = _compile_operator(name, value[name], f"{here}.{name}", problems)
            if atoms:
                groups.append((name, atoms))
        if unknown or len(groups) != len(names):
            return None
        return FieldCondition(key, groups=tuple(groups))
    problems.append(
        f"{here}: must be a list of values, a map of operators or a map of nested fields "
        f"(got {show(value)}; write [{_bare(value)}] for equality)"
    )
    return None


def _misspelled_operators(raw: Mapping[object, object], here: str, problems: list[str]) -> bool:
    """A nested field named like an operator (``Prefix``, ``prefx``, ``exist``) is almost
    surely a typo, and as a field it would make the rule silently dead: refuse it."""
    found = False
    for key in raw:
        if not isinstance(key, str):
            continue
        lowered = key.lower()
        close = [lowered] if lowered in OPERATOR_SET else []
        close = close or difflib.get_close_matches(lowered, _LONG_OPERATORS, n=1, cutoff=0.8)
        if close:
            problems.append(
                f"{field_path(here, key)}: unknown operator {show(key)} "
                f'(did you mean "{close[0]}"? operators are {", ".join(OPERATORS)})'
            )
            found = True
    return found


def _bare(value: object) -> str:
    return value if isinstance(value, str) and value.isprintable() else show(value)


def _scalars(value: object, here: str, problems: list[str]) -> tuple[object, ...] | None:
    listed = isinstance(value, list | tuple)
    items = list(value) if isinstance(value, list | tuple) else [value]
    if not items:
        problems.append(f"{here}: must list at least one value")
        return None
    ok = True
    for i, item in enumerate(items):
        at = f"{here}[{i}]" if listed else here
        problem = _scalar_problem(item)
        if problem is not None:
            problems.append(f"{at}: {problem}")
            ok = False
    return tuple(items) if ok else None


def _scalar_problem(item: object) -> str | None:
    if isinstance(item, date):  # YAML reads an unquoted 2026-09-12 as a date
        return (
            f"YAML read the timestamp {item.isoformat()}; quote it to compare text "
            "(timestamp literals are not accepted in comparisons: use now())"
        )
    if not is_scalar(item):
        return f"must be a string, number, boolean or null (got {show(item)})"
    if isinstance(item, float) and not math.isfinite(item):
        return f"must be a finite number (got {show(item)})"
    return None


def _compile_operator(
    name: str, operand: object, here: str, problems: list[str]
) -> tuple[Atom, ...]:
    if name == "exists":
        if isinstance(operand, bool):
            return (ExistsAtom(operand),)
        problems.append(f"{here}: must be true or false (got {show(operand)})")
        return ()
    values = _scalars(operand, here, problems)
    if values is None:
        return ()
    if name == "equals":
        return (EqualsAtom(values),)
    if name in ("prefix", "suffix"):
        return _affix(name, values, here, problems)
    atoms: list[Atom] = []
    for i, v in enumerate(values):
        at = here if len(values) == 1 else f"{here}[{i}]"
        atom = _comparison(name, v, at, problems)
        if atom is not None:
            atoms.append(atom)
    return tuple(atoms) if len(atoms) == len(values) else ()


def _affix(
    name: str, values: tuple[object, ...], here: str, problems: list[str]
) -> tuple[Atom, ...]:
    bad = [v for v in values if not isinstance(v, str)]
    if bad:
        problems.append(f"{here}: operands must be strings (got {show(bad[0])})")
        return ()
    return (AffixAtom(tuple(str(v) for v in values), prefix=name == "prefix"),)


def _comparison(name: str, operand: object, here: str, problems: list[str]) -> Atom | None:
    if is_number(operand):
        return NumericAtom(name, operand)  # type: ignore[arg-type]  # checked by is_number
    if isinstance(operand, str):
        offset = _now_offset(operand)
        if isinstance(offset, int):
            return TemporalAtom(name, offset, operand)
        problems.append(f"{here}: {offset}")
        return None
    problems.append(
        f'{here}: must be a number or a now() expression such as "now()-5m" (got {show(operand)})'
    )
    return None


def _now_offset(text: str) -> int | str:
    """The offset in ns of a ``now()``/``now()±duration`` expression, or why it is not one."""
    m = _NOW.fullmatch(text)
    if m is None:
        if _OLD_NOW.fullmatch(text.strip()):
            fixed = "now()" + text.strip()[3:].strip()
            return f"{show(text)} is the old syntax; write {show(fixed)}"
        return (
            f"{show(text)} is not a valid operand: use a number or a now() expression "
            'such as "now()-5m" (timestamp literals are not accepted)'
        )
    sign, rest = m.group(1), m.group(2)
    if sign is None:
        return 0
    if not rest or not rest.isascii() or rest != rest.strip() or rest[0] in "+-":
        return f"{show(text)}: expected a Go duration after {sign!r}, such as now(){sign}5m"
    try:
        ns = parse_duration(rest)
    except DurationError:
        return f"{show(text)}: {rest!r} is not a Go duration (examples: 30s, 5m, 1h30m)"
    return -ns if sign == "-" else ns
