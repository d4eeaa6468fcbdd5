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

import json
import math
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, date, datetime
from typing import Final

from relay.domain.durations import DurationError, format_duration, parse_duration
from relay.domain.errors import TemplateError

OPERATORS: Final = ("equals", "prefix", "suffix", "exists", "gt", "gte", "lt", "lte")
_OPERATOR_SET: Final = frozenset(OPERATORS)
_COMPARISONS: Final[dict[str, tuple[Callable[[float, float], bool], str, str]]] = {
    # operator: (comparison, numeric wording, temporal wording)
    "gt": (operator.gt, "greater than", "after"),
    "gte": (operator.ge, "greater than or equal to", "at or after"),
    "lt": (operator.lt, "less than", "before"),
    "lte": (operator.le, "less than or equal to", "at or before"),
}
MAX_PATTERN_DEPTH: Final = 32
_NOW = re.compile(r"now\(\)(?:([+-])(.*))?", re.DOTALL)
_OLD_NOW = re.compile(r"now(?:\s*[+-].*)?", re.DOTALL | re.IGNORECASE)
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")

# A key path through nested objects and the equality keys allowed there.
EqualityCondition = tuple[tuple[str, ...], frozenset[object]]


def equality_key(value: object) -> object | None:
    """The canonical, type-tagged form used for equality, or ``None`` for a
    non-scalar (a list or an object never equals a pattern value).

    Strings stand for themselves; numbers compare by value (``1`` equals ``1.0``) but
    never equal a boolean or a string (``1`` is not ``true``, not ``"1"``).
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    if value is None:
        return ("z",)
    return None


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | bool | int | float)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def show(value: object, limit: int = 80) -> str:
    """A value as JSON text, shortened for one-line messages."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True, default=repr)
    except (ValueError, TypeError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show_list(values: tuple[object, ...]) -> str:
    return "[" + ", ".join(show(v) for v in values) + "]"


def field_path(where: str, key: str) -> str:
    return f"{where}.{key}" if _PLAIN_KEY.fullmatch(key) else f"{where}[{show(key)}]"


def parse_rfc3339(text: str) -> float | None:
    """An RFC3339 timestamp as unix seconds, or ``None`` when it is not one."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    try:
        instant = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None
    seconds = instant.timestamp()
    if m.group(9) is not None:
        off_h, off_m = int(m.group(10)), int(m.group(11))
        if off_h > 23 or off_m > 59:
            return None
        offset = off_h * 3600 + off_m * 60
        seconds = seconds - offset if m.group(9) == "+" else seconds + offset
    fraction = float(m.group(7)) if m.group(7) else 0.0
    return seconds + fraction


def _format_instant(seconds: float) -> str:
    try:
        moment = datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return "out of range"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- atoms: one operand of one operator ------------------------------------------


class _Atom:
    """One operand of one operator; holds when the field's value satisfies it."""

    __slots__ = ()

    def test(self, present: bool, value: object, now: float) -> bool:
        raise NotImplementedError

    def why(self, present: bool, value: object, now: float) -> str:
        raise NotImplementedError


class _Equals(_Atom):
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


class _Affix(_Atom):
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


class _Exists(_Atom):
    __slots__ = ("want",)

    def __init__(self, want: bool) -> None:
        self.want = want

    def test(self, present: bool, value: object, now: float) -> bool:
        return present is self.want

    def why(self, present: bool, value: object, now: float) -> str:
        return "is missing" if self.want else f"is present (value {show(value)})"


class _Numeric(_Atom):
    __slots__ = ("cmp", "threshold", "wording")

    def __init__(self, op: str, threshold: float) -> None:
        self.cmp, self.wording, _ = _COMPARISONS[op]
        self.threshold = threshold

    def test(self, present: bool, value: object, now: float) -> bool:
        if not present or not _is_number(value):
            return False
        return self.cmp(value, self.threshold)  # type: ignore[arg-type]  # checked above

    def why(self, present: bool, value: object, now: float) -> str:
        if not present:
            return "missing"
        if not _is_number(value):
            return f"value is not a number (got {show(value)})"
        return f"{show(value)} is not {self.wording} {show(self.threshold)}"


class _Temporal(_Atom):
    __slots__ = ("cmp", "offset_s", "text", "wording")

    def __init__(self, op: str, offset_ns: int, text: str) -> None:
        self.cmp, _, self.wording = _COMPARISONS[op]
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
        cutoff = _format_instant(now + self.offset_s)
        return f"{show(value)} is not {self.wording} {self.text} ({cutoff})"


# --- field conditions -------------------------------------------------------------


class _Field:
    """The condition on one key of a JSON object."""

    __slots__ = ("children", "equals", "groups", "key")

    def __init__(
        self,
        key: str,
        *,
        equals: _Equals | None = None,
        groups: tuple[tuple[str, tuple[_Atom, ...]], ...] = (),
        children: tuple[_Field, ...] = (),
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
        else:
            inner = value if present and isinstance(value, Mapping) else None
            for child in self.children:
                yield from child.explain(inner, now, here)

    def equality_paths(self, prefix: tuple[str, ...]) -> Iterator[EqualityCondition]:
        path = (*prefix, self.key)
        if self.equals is not None:
            yield path, self.equals.keys
        elif self.groups:
            if all(name == "equals" for name, _ in self.groups):
                keys: set[object] = set()
                for _, atoms in self.groups:
                    for atom in atoms:
                        assert isinstance(atom, _Equals)
                        keys |= atom.keys
                yield path, frozenset(keys)
        else:
            for child in self.children:
                yield from child.equality_paths(path)


class CompiledPattern:
    """A pattern compiled for matching. Build it with :func:`compile_pattern`."""

    __slots__ = ("_canonical", "_fields", "raw")

    def __init__(self, fields: tuple[_Field, ...], raw: Mapping[str, object]) -> None:
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
) -> tuple[_Field, ...]:
    if depth > MAX_PATTERN_DEPTH:
        problems.append(f"{where}: nested deeper than {MAX_PATTERN_DEPTH} levels")
        return ()
    if not raw:
        problems.append(f"{where}: must contain at least one field condition")
        return ()
    fields: list[_Field] = []
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
) -> _Field | None:
    if isinstance(value, list | tuple):
        values = _scalars(value, here, problems)
        return _Field(key, equals=_Equals(values)) if values is not None else None
    if isinstance(value, Mapping):
        names = [k for k in value if isinstance(k, str) and k in _OPERATOR_SET]
        if not names:
            children = _compile_fields(value, here, problems, depth + 1)
            return _Field(key, children=children) if children else None
        unknown = [k for k in value if k not in _OPERATOR_SET]
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
        return _Field(key, groups=tuple(groups))
    problems.append(
        f"{here}: must be a list of values, a map of operators or a map of nested fields "
        f"(got {show(value)}; write [{_bare(value)}] for equality)"
    )
    return None


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
    if not _is_scalar(item):
        return f"must be a string, number, boolean or null (got {show(item)})"
    if isinstance(item, float) and not math.isfinite(item):
        return f"must be a finite number (got {show(item)})"
    return None


def _compile_operator(
    name: str, operand: object, here: str, problems: list[str]
) -> tuple[_Atom, ...]:
    if name == "exists":
        if isinstance(operand, bool):
            return (_Exists(operand),)
        problems.append(f"{here}: must be true or false (got {show(operand)})")
        return ()
    values = _scalars(operand, here, problems)
    if values is None:
        return ()
    if name == "equals":
        return (_Equals(values),)
    if name in ("prefix", "suffix"):
        return _affix(name, values, here, problems)
    atoms: list[_Atom] = []
    for i, v in enumerate(values):
        at = here if len(values) == 1 else f"{here}[{i}]"
        atom = _comparison(name, v, at, problems)
        if atom is not None:
            atoms.append(atom)
    return tuple(atoms) if len(atoms) == len(values) else ()


def _affix(
    name: str, values: tuple[object, ...], here: str, problems: list[str]
) -> tuple[_Atom, ...]:
    bad = [v for v in values if not isinstance(v, str)]
    if bad:
        problems.append(f"{here}: operands must be strings (got {show(bad[0])})")
        return ()
    return (_Affix(tuple(str(v) for v in values), prefix=name == "prefix"),)


def _comparison(name: str, operand: object, here: str, problems: list[str]) -> _Atom | None:
    if _is_number(operand):
        return _Numeric(name, operand)  # type: ignore[arg-type]  # checked by _is_number
    if isinstance(operand, str):
        offset = _now_offset(operand)
        if isinstance(offset, int):
            return _Temporal(name, offset, operand)
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


def value_at(event: object, path: tuple[str, ...]) -> tuple[bool, object]:
    """Follow ``path`` through nested objects: (present, value)."""
    value = event
    for key in path:
        if (type(value) is dict or isinstance(value, Mapping)) and key in value:
            value = value[key]
        else:
            return False, None
    return True, value


def describe_offset(ns: int) -> str:
    if ns == 0:
        return "now()"
    return f"now(){'-' if ns < 0 else '+'}{format_duration(abs(ns))}"
