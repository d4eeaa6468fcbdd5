"""Property tests: matching never raises and agrees with a naive reference matcher.

The reference below interprets the raw pattern directly, written from the rules in
docs/templates.md without reusing any of the compiler's code.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from relay.domain.errors import TemplateError
from relay.domain.patterns import compile_pattern

NOW = 1_789_207_200  # 2026-09-12T10:00:00Z
KEYS = ["a", "b", "c"]
OPS = {"equals", "prefix", "suffix", "exists", "gt", "gte", "lt", "lte"}
MISSING = object()

# --- strategies -----------------------------------------------------------------------

timestamps = st.builds(
    lambda y, mo, d, h, mi, s, frac, off: (
        f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}" + frac + off
    ),
    st.integers(2025, 2027),
    st.integers(1, 12),
    st.integers(1, 31),
    st.integers(0, 24),
    st.integers(0, 59),
    st.integers(0, 60),
    st.sampled_from(["", ".5", ".123", ".000001"]),
    st.sampled_from(["Z", "+02:00", "-05:30", "+00:00", "", "+25:00"]),
)
near_now = st.integers(-7200, 7200).map(
    lambda delta: datetime.fromtimestamp(NOW + delta).astimezone().isoformat()
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, -1, 1.0, 0.5, 18, 100.5, 2**63]),
    st.sampled_from(["x", "y", "", "1", "user_1", "abc.png", "INSERT"]),
    timestamps,
    near_now,
)
json_values = st.recursive(
    st.one_of(
        scalars,
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=8),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
    ),
    max_leaves=12,
)
events = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=3)

pattern_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, 1.0, 0.5, 18, -1]),
    st.sampled_from(["x", "y", "", "1", "user_1", "INSERT"]),
)
now_expressions = st.sampled_from(["now()", "now()-5m", "now()+1h30m", "now()+0s", "now()-24h"])
thresholds = st.one_of(
    st.sampled_from([0, 1, 18, 100.5, -3, 0.5]),
    now_expressions,
)


def one_or_list(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(strategy, st.lists(strategy, min_size=1, max_size=3))


operator_values = {
    "equals": one_or_list(pattern_scalars),
    "prefix": one_or_list(st.sampled_from(["", "u", "user_", "x", "1"])),
    "suffix": one_or_list(st.sampled_from(["", ".png", "1", "y"])),
    "exists": st.booleans(),
    "gt": one_or_list(thresholds),
    "gte": one_or_list(thresholds),
    "lt": one_or_list(thresholds),
    "lte": one_or_list(thresholds),
}
operator_maps = st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=3, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({n: operator_values[n] for n in names})
)
conditions = st.recursive(
    st.one_of(st.lists(pattern_scalars, min_size=1, max_size=3), operator_maps),
    lambda inner: st.dictionaries(st.sampled_from(KEYS), inner, min_size=1, max_size=3),
    max_leaves=6,
)
patterns = st.dictionaries(st.sampled_from(KEYS), conditions, min_size=1, max_size=3)


def _listed(operands: Any) -> list[Any]:
    return operands if isinstance(operands, list) else [operands]


def _candidates(op: str, operand: Any) -> list[Any]:
    if op == "equals":
        return [operand]
    if op == "prefix":
        return [operand + "tail"]
    if op == "suffix":
        return ["head" + operand]
    if isinstance(operand, str):
        return []  # now() operands: the near_now strategy covers them
    return [operand, operand + 1, operand - 1, float(operand)]


def value_for(condition: Any) -> st.SearchStrategy[Any]:
    """Values likely to satisfy ``condition``, mixed with arbitrary ones."""
    if isinstance(condition, list):
        return st.one_of(st.sampled_from(condition), st.sampled_from(condition), json_values)
    if set(condition) & OPS:
        options = [c for op, v in condition.items() for o in _listed(v) for c in _candidates(op, o)]
        guided = st.sampled_from(options) if options else near_now
        return st.one_of(guided, guided, near_now, json_values)
    return object_for(condition)


def object_for(pattern: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An object following ``pattern`` closely: each key usually present, sometimes not."""
    fields = {key: value_for(condition) for key, condition in pattern.items()}
    return st.one_of(
        st.fixed_dictionaries(fields),
        st.fixed_dictionaries(fields),
        st.fixed_dictionaries({}, optional=fields),
    )


guided = patterns.flatmap(lambda p: st.tuples(st.just(p), st.one_of(object_for(p), events)))

# --- the reference matcher ------------------------------------------------------------

_STAMP = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})"
)


def ref_instant(value: object) -> float | None:
    if not isinstance(value, str) or not _STAMP.fullmatch(value):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def ref_number(value: object) -> bool:
    return type(value) in (int, float)


def ref_equal(want: object, got: object) -> bool:
    if type(want) is bool or type(got) is bool:
        return type(want) is type(got) and want == got
    if want is None or got is None:
        return want is None and got is None
    if isinstance(want, str) or isinstance(got, str):
        return isinstance(want, str) and isinstance(got, str) and want == got
    return ref_number(want) and ref_number(got) and want == got


def ref_cutoff(expression: str) -> float:
    offsets = {"": 0, "-5m": -300, "+1h30m": 5400, "+0s": 0, "-24h": -86400}
    return NOW + offsets[expression[len("now()") :]]


def ref_compare(op: str, left: float, right: float) -> bool:
    if op == "gt":
        return left > right
    if op == "gte":
        return left >= right
    if op == "lt":
        return left < right
    return left <= right


def ref_operand(op: str, operand: Any, value: Any) -> bool:
    if value is MISSING:
        return op == "exists" and operand is False
    if op == "exists":
        return operand is True
    if op == "equals":
        return ref_equal(operand, value)
    if op == "prefix":
        return isinstance(value, str) and value.startswith(operand)
    if op == "suffix":
        return isinstance(value, str) and value.endswith(operand)
    if isinstance(operand, str):
        instant = ref_instant(value)
        return instant is not None and ref_compare(op, instant, ref_cutoff(operand))
    if not ref_number(value) or (isinstance(value, float) and math.isnan(value)):
        return False
    return ref_compare(op, value, operand)


def ref_lookup(container: Any, key: str) -> Any:
    return container[key] if isinstance(container, dict) and key in container else MISSING


def ref_condition(condition: Any, value: Any) -> bool:
    if isinstance(condition, list):
        return value is not MISSING and any(ref_equal(c, value) for c in condition)
    if set(condition) & OPS:
        for op, operands in condition.items():
            listed = operands if isinstance(operands, list) else [operands]
            if any(ref_operand(op, operand, value) for operand in listed):
                return True
        return False
    return all(ref_condition(sub, ref_lookup(value, key)) for key, sub in condition.items())


def ref_match(pattern: dict[str, Any], event: Any) -> bool:
    return all(ref_condition(cond, ref_lookup(event, key)) for key, cond in pattern.items())


# --- properties -----------------------------------------------------------------------


@settings(deadline=None)
@given(guided)
def test_matching_agrees_with_the_reference(case: tuple[dict[str, Any], dict[str, Any]]) -> None:
    pattern, event = case
    compiled = compile_pattern(pattern)
    result = compiled.matches(event, NOW)
    assert result == ref_match(pattern, event)
    assert (compiled.explain(event, NOW) == []) == result


@settings(deadline=None)
@given(patterns, json_values)
def test_matching_never_raises_on_any_json_value(pattern: dict[str, Any], event: Any) -> None:
    compiled = compile_pattern(pattern)
    compiled.matches(event, NOW)
    compiled.explain(event, NOW)
    compiled.matches({"a": event, "b": {"a": event, "b": event, "c": event}}, NOW)


@settings(deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), json_values, min_size=1, max_size=3))
def test_compiling_arbitrary_json_raises_only_template_errors(raw: dict[str, Any]) -> None:
    problems: list[str] = []
    try:
        compiled = compile_pattern(raw)
    except TemplateError as exc:
        problems = exc.problems
    else:
        compiled.matches({}, NOW)
        return
    assert problems
    assert all(line.startswith("pattern") for line in problems)
