"""The pattern language: compile-time validation and match-time semantics."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import pytest

from relay.domain.errors import TemplateError
from relay.domain.patterns import compile_pattern, equality_key, parse_rfc3339

NOW = datetime(2026, 9, 12, 10, 0, 0, tzinfo=UTC).timestamp()


def matches(pattern: dict[str, Any], event: dict[str, Any], now: float = NOW) -> bool:
    compiled = compile_pattern(pattern)
    result = compiled.matches(event, now)
    assert result == (compiled.explain(event, now) == [])  # explain agrees with matches
    return result


def problems(raw: object) -> list[str]:
    with pytest.raises(TemplateError) as caught:
        compile_pattern(raw)
    return caught.value.problems


# --- equality -------------------------------------------------------------------------


def test_a_list_is_equality_with_any_value() -> None:
    pattern = {"status": ["COMPLETED", "FAILED"]}
    assert matches(pattern, {"status": "COMPLETED"})
    assert matches(pattern, {"status": "FAILED"})
    assert not matches(pattern, {"status": "RUNNING"})
    assert not matches(pattern, {})


@pytest.mark.parametrize(
    ("allowed", "value", "expected"),
    [
        (1, 1, True),
        (1, 1.0, True),  # numbers compare by value
        (1.5, 1.5, True),
        (1, "1", False),
        ("1", 1, False),
        (True, 1, False),
        (1, True, False),
        (False, 0, False),
        (0, False, False),
        (True, True, True),
        (None, None, True),
        (None, "", False),
        (None, 0, False),
        ("", None, False),
        ("a", ["a"], False),
        ("a", {"a": 1}, False),
    ],
)
def test_equality_is_type_preserving(allowed: object, value: object, expected: bool) -> None:
    assert matches({"f": [allowed]}, {"f": value}) is expected
    assert matches({"f": {"equals": [allowed]}}, {"f": value}) is expected


def test_equals_accepts_a_single_value() -> None:
    assert matches({"f": {"equals": "x"}}, {"f": "x"})


def test_equality_key_tags_types() -> None:
    assert equality_key(1) == equality_key(1.0)
    assert equality_key(1) != equality_key(True)
    assert equality_key("1") != equality_key(1)
    assert equality_key([1]) is None


# --- prefix / suffix ------------------------------------------------------------------


def test_prefix_and_suffix_match_strings_only() -> None:
    assert matches({"id": {"prefix": ["user_"]}}, {"id": "user_123"})
    assert not matches({"id": {"prefix": ["user_"]}}, {"id": "123"})
    assert matches({"id": {"prefix": ["a", "user_"]}}, {"id": "user_1"})
    assert matches({"file": {"suffix": [".png", ".jpg"]}}, {"file": "x.jpg"})
    assert not matches({"file": {"suffix": [".png"]}}, {"file": "x.jpg"})
    assert not matches({"n": {"prefix": ["12"]}}, {"n": 123})
    assert not matches({"n": {"suffix": ["3"]}}, {"n": 123})
    assert not matches({"n": {"prefix": ["t"]}}, {"n": True})
    assert not matches({"n": {"prefix": ["x"]}}, {"n": None})
    assert not matches({"n": {"prefix": ["x"]}}, {})


# --- exists ---------------------------------------------------------------------------


def test_exists_checks_presence_and_null_counts_as_present() -> None:
    assert matches({"name": {"exists": True}}, {"name": None})
    assert matches({"name": {"exists": True}}, {"name": 0})
    assert not matches({"name": {"exists": True}}, {})
    assert matches({"name": {"exists": False}}, {})
    assert not matches({"name": {"exists": False}}, {"name": None})


def test_nested_exists() -> None:
    pattern_true = {"new_image": {"name": {"exists": True}}}
    pattern_false = {"new_image": {"name": {"exists": False}}}
    assert matches(pattern_true, {"new_image": {"name": "x"}})
    assert not matches(pattern_true, {"new_image": {}})
    assert not matches(pattern_true, {})  # parent missing: nested key cannot be present
    assert not matches(pattern_true, {"new_image": "scalar"})
    assert matches(pattern_false, {"new_image": {}})
    assert matches(pattern_false, {})  # parent missing: nested key necessarily absent
    assert matches(pattern_false, {"new_image": None})
    assert matches(pattern_false, {"new_image": [1, 2]})
    assert not matches(pattern_false, {"new_image": {"name": None}})
    assert matches({"new_image": {"exists": True}}, {"new_image": {}})


def test_exists_composes_with_other_operators_as_or() -> None:
    pattern = {"name": {"exists": False, "prefix": ["12"]}}
    assert matches(pattern, {})
    assert matches(pattern, {"name": "123"})
    assert not matches(pattern, {"name": "456"})


# --- numeric comparisons --------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "threshold", "value", "expected"),
    [
        ("gt", 18, 19, True),
        ("gt", 18, 18, False),
        ("gte", 18, 18, True),
        ("gte", 18, 17.9, False),
        ("lt", 100.5, 100, True),
        ("lt", 100.5, 100.5, False),
        ("lte", 100.5, 100.5, True),
        ("lte", 100.5, 101, False),
        ("gt", 0, 10**30, True),
        ("gt", 1.5, 2**63, True),
        ("gt", 18, "19", False),  # strings are not numbers
        ("gt", 0, True, False),  # booleans are not numbers
        ("lt", 1, False, False),
        ("gt", 0, None, False),
        ("gt", 0, [1], False),
        ("gt", 0, {"a": 1}, False),
        ("lt", 0, float("nan"), False),
        ("gt", 0, float("inf"), True),
    ],
)
def test_numeric_comparisons(op: str, threshold: float, value: object, expected: bool) -> None:
    assert matches({"f": {op: threshold}}, {"f": value}) is expected


def test_numeric_comparison_missing_field_fails() -> None:
    assert not matches({"age": {"gt": 18}}, {})


def test_operand_lists_are_or() -> None:
    assert matches({"f": {"gt": [100, 5]}}, {"f": 6})
    assert not matches({"f": {"lt": [1, 2]}}, {"f": 3})


def test_several_operators_on_one_field_are_or_not_a_range() -> None:
    pattern = {"f": {"gt": 10, "lt": 5}}
    assert matches(pattern, {"f": 11})
    assert matches(pattern, {"f": 1})
    assert not matches(pattern, {"f": 7})


# --- temporal comparisons -------------------------------------------------------------


@pytest.mark.parametrize(
    ("operand", "value", "expected"),
    [
        ("now()-5m", "2026-09-12T09:58:00Z", True),
        ("now()-5m", "2026-09-12T09:54:00Z", False),
        ("now()-5m", "2026-09-12T11:58:00+02:00", True),  # offsets are respected
        ("now()-5m", "2026-09-12T09:58:00.5Z", True),
        ("now()-5m", "2026-09-12t09:58:00z", True),
        ("now()", "2026-09-12T10:00:01Z", True),
        ("now()", "2026-09-12T10:00:00Z", False),
        ("now()+0s", "2026-09-12T10:00:01Z", True),
        ("now()+1h30m", "2026-09-12T11:31:00Z", True),
        ("now()+1h30m", "2026-09-12T11:29:00Z", False),
        ("now()-24h", "2026-09-11T10:00:01Z", True),
        ("now()-5m", "2026-09-12 09:58:00Z", False),  # not RFC3339 (space)
        ("now()-5m", "2026-09-12T09:58:00", False),  # no offset
        ("now()-5m", "2026-02-30T09:58:00Z", False),  # no such day
        ("now()-5m", "2026-09-12T24:00:00Z", False),
        ("now()-5m", "2026-09-12T09:58:00+24:00", False),
        ("now()-5m", "yesterday", False),
        ("now()-5m", 1789200000, False),  # numbers are not timestamps
        ("now()-5m", None, False),
        ("now()-5m", True, False),
        ("now()-5m", ["2026-09-12T09:58:00Z"], False),
        ("now()-5m", "0001-01-01T00:00:00+01:00", False),
        ("now()-5m", "9999-12-31T23:59:59-01:00", True),
    ],
)
def test_gt_now(operand: str, value: object, expected: bool) -> None:
    assert matches({"created_at": {"gt": operand}}, {"created_at": value}) is expected


def test_temporal_operators_evaluate_now_at_match_time() -> None:
    compiled = compile_pattern({"t": {"gt": "now()-5m"}})
    event = {"t": "2026-09-12T10:00:00Z"}
    assert compiled.matches(event, NOW)
    assert compiled.matches(event, NOW + 299)
    assert not compiled.matches(event, NOW + 300)  # the cutoff moved past the value


def test_two_temporal_operators_are_alternatives() -> None:
    compiled = compile_pattern({"t": {"gte": "now()-1h", "lt": "now()"}})
    assert compiled.matches({"t": "2026-09-12T08:00:00Z"}, NOW)  # lt holds
    assert compiled.matches({"t": "2026-09-12T11:00:00Z"}, NOW)  # gte holds
    assert not compiled.matches({"t": "not a time"}, NOW)


@pytest.mark.parametrize("op", ["gte", "lt", "lte"])
def test_every_comparison_takes_now(op: str) -> None:
    compiled = compile_pattern({"t": {op: "now()"}})
    assert compiled.matches({"t": "2026-09-12T10:00:00Z"}, NOW) is (op != "lt")


def test_missing_parent_never_matches_temporal() -> None:
    assert not matches({"new_image": {"created_at": {"gt": "now()-5m"}}}, {})


def test_parse_rfc3339() -> None:
    assert parse_rfc3339("1970-01-01T00:00:00Z") == 0
    assert parse_rfc3339("1970-01-01T01:00:00+01:00") == 0
    assert parse_rfc3339("1970-01-01T00:00:00.25Z") == 0.25
    assert parse_rfc3339("1970-01-01T00:00:00") is None
    assert parse_rfc3339("1970-01-01T00:00:60Z") is None
    assert parse_rfc3339("\u0661970-01-01T00:00:00Z") is None  # only ASCII digits


# --- combination rules ----------------------------------------------------------------


def test_siblings_are_and_and_extra_fields_are_ignored() -> None:
    pattern = {"event_name": ["INSERT"], "table_name": ["users"]}
    assert matches(pattern, {"event_name": "INSERT", "table_name": "users", "extra": 1})
    assert not matches(pattern, {"event_name": "INSERT", "table_name": "orders"})
    assert not matches(pattern, {"event_name": "INSERT"})


def test_nested_conditions() -> None:
    pattern = {"new_image": {"status": ["active"], "owner": {"id": {"prefix": ["u_"]}}}}
    assert matches(pattern, {"new_image": {"status": "active", "owner": {"id": "u_1"}}})
    assert not matches(pattern, {"new_image": {"status": "active", "owner": {"id": "g_1"}}})
    assert not matches(pattern, {"new_image": {"status": "active", "owner": "u_1"}})
    assert not matches(pattern, {"new_image": "active"})


def test_dotted_keys_are_literal_keys_not_paths() -> None:
    assert matches({"a.b": [1]}, {"a.b": 1})
    assert not matches({"a.b": [1]}, {"a": {"b": 1}})


def test_non_object_events_never_match_and_never_raise() -> None:
    compiled = compile_pattern({"a": {"exists": False}, "b": {"exists": False}})
    events: list[Any] = [[], None, "x", 3]
    for event in events:
        assert compiled.matches(event, NOW)
    assert not compile_pattern({"a": [1]}).matches(events[0], NOW)


# --- explain --------------------------------------------------------------------------


def explain(pattern: dict[str, Any], event: dict[str, Any]) -> list[str]:
    return compile_pattern(pattern).explain(event, NOW)


def test_explain_names_each_failing_condition() -> None:
    pattern = {"table_name": ["users"], "event_name": ["INSERT"], "id": {"prefix": ["user_"]}}
    event = {"table_name": "orders", "event_name": "INSERT", "id": "123"}
    assert explain(pattern, event) == [
        'pattern.table_name: "orders" is not one of ["users"]',
        'pattern.id.prefix: "123" does not start with any of ["user_"]',
    ]


@pytest.mark.parametrize(
    ("pattern", "event", "line"),
    [
        ({"a": ["x"]}, {}, 'pattern.a: missing (expected one of ["x"])'),
        ({"a": {"exists": True}}, {}, "pattern.a.exists: is missing"),
        ({"a": {"exists": False}}, {"a": 1}, "pattern.a.exists: is present (value 1)"),
        ({"a": {"gt": 5}}, {"a": 5}, "pattern.a.gt: 5 is not greater than 5"),
        ({"a": {"lte": 5}}, {"a": "6"}, 'pattern.a.lte: value is not a number (got "6")'),
        ({"a": {"suffix": ["z"]}}, {"a": 1}, "pattern.a.suffix: value is not a string (got 1)"),
        (
            {"created_at": {"gt": "now()-5m"}},
            {"created_at": 5},
            "pattern.created_at.gt: value is not an RFC3339 string (got 5)",
        ),
        (
            {"created_at": {"gt": "now()-5m"}},
            {"created_at": "2026-09-12T09:00:00Z"},
            'pattern.created_at.gt: "2026-09-12T09:00:00Z" is not after now()-5m '
            "(2026-09-12T09:55:00Z)",
        ),
        (
            {"n": {"new": {"x": [1]}}},
            {"n": {"new": {}}},
            "pattern.n.new.x: missing (expected one of [1])",
        ),
        ({"n": {"new": {"x": [1]}}}, {"n": {}}, "pattern.n.new: missing (expected an object)"),
        ({"n": {"x": [1], "y": [2]}}, {"n": [1]}, "pattern.n: [1] is not an object"),
        (
            {"a": {"gt": 10, "lt": 5}},
            {"a": 7},
            "pattern.a: no alternative holds (gt: 7 is not greater than 10; "
            "lt: 7 is not less than 5)",
        ),
        ({"a b": [1]}, {}, 'pattern["a b"]: missing (expected one of [1])'),
    ],
)
def test_explain_lines(pattern: dict[str, Any], event: dict[str, Any], line: str) -> None:
    assert explain(pattern, event) == [line]


def test_explain_is_empty_on_match() -> None:
    assert explain({"a": [1]}, {"a": 1}) == []


# --- compile-time validation ----------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "line"),
    [
        ("x", 'pattern: must be a map of field conditions (got "x")'),
        ([], "pattern: must be a map of field conditions (got [])"),
        ({}, "pattern: must contain at least one field condition"),
        ({"a": {}}, "pattern.a: must contain at least one field condition"),
        ({"a": []}, "pattern.a: must list at least one value"),
        ({"a": [[1]]}, "pattern.a[0]: must be a string, number, boolean or null (got [1])"),
        ({"a": [{"b": 1}]}, "pattern.a[0]: must be a string, number, boolean or null "
         '(got {"b": 1})'),
        ({"a": [float("nan")]}, "pattern.a[0]: must be a finite number (got NaN)"),
        ({"a": {"exists": "true"}}, 'pattern.a.exists: must be true or false (got "true")'),
        ({"a": {"exists": 1}}, "pattern.a.exists: must be true or false (got 1)"),
        ({"a": {"exists": None}}, "pattern.a.exists: must be true or false (got null)"),
        ({"a": {"exists": [True]}}, "pattern.a.exists: must be true or false (got [true])"),
        ({"a": {"prefix": [1]}}, "pattern.a.prefix: operands must be strings (got 1)"),
        ({"a": {"suffix": []}}, "pattern.a.suffix: must list at least one value"),
        ({"a": {"equals": []}}, "pattern.a.equals: must list at least one value"),
        ({"a": {"gt": "now-5m"}}, 'pattern.a.gt: "now-5m" is the old syntax; write "now()-5m"'),
        ({"a": {"gt": "now"}}, 'pattern.a.gt: "now" is the old syntax; write "now()"'),
        ({"a": {"gt": True}}, "pattern.a.gt: must be a number or a now() expression such as "
         '"now()-5m" (got true)'),
        ({"a": {"gt": None}}, "pattern.a.gt: must be a number or a now() expression such as "
         '"now()-5m" (got null)'),
        ({"a": {"lt": "now()-5x"}}, "pattern.a.lt: \"now()-5x\": '5x' is not a Go duration "
         "(examples: 30s, 5m, 1h30m)"),
        ({"a": {"lt": "now()-"}}, 'pattern.a.lt: "now()-": expected a Go duration after '
         "'-', such as now()-5m"),
        ({"a": {"lt": "now()--5m"}}, 'pattern.a.lt: "now()--5m": expected a Go duration after '
         "'-', such as now()-5m"),
        ({"a": {"lt": "now() - 5m"}}, None),
        ({"a": {"gt": "2026-09-12T10:00:00Z"}}, None),
        ({"a": {"gt": "100"}}, None),
        ({"a": {"gt": [1, "soon"]}}, None),
        ({"a": {"gt": float("inf")}}, "pattern.a.gt: must be a finite number (got Infinity)"),
        ({"a": {"gte": {"x": 1}}}, 'pattern.a.gte: must be a string, number, boolean or '
         'null (got {"x": 1})'),
        ({"a": {"gt": datetime(2026, 9, 12, 10, tzinfo=UTC)}}, "pattern.a.gt: YAML read the "
         "timestamp 2026-09-12T10:00:00+00:00; quote it to compare text (timestamp literals "
         "are not accepted in comparisons: use now())"),
        ({"a": [date(2026, 9, 12)]}, None),
        ({"a": {"gt": 1, "between": [1, 2]}}, None),
        ({"a": "x"}, 'pattern.a: must be a list of values, a map of operators or a map of '
         'nested fields (got "x"; write [x] for equality)'),
        ({"a": 5}, None),
        ({"a": None}, None),
        ({True: ["x"]}, None),
        ({"a": {"b": {"c": "x"}}}, None),
    ],
)  # fmt: skip
def test_invalid_patterns(raw: object, line: str | None) -> None:
    found = problems(raw)
    assert len(found) == 1, found
    if line is not None:
        assert found[0] == line
    assert found[0].startswith("pattern")


def test_timestamp_literals_are_rejected_with_a_hint() -> None:
    (line,) = problems({"a": {"gt": "2026-09-12T10:00:00Z"}})
    assert "timestamp literals are not accepted" in line


def test_unknown_operator_next_to_a_known_one() -> None:
    (line,) = problems({"a": {"gt": 1, "between": [1, 2]}})
    assert line.startswith('pattern.a: unknown operator "between" next to gt')


def test_yaml_boolean_keys_get_a_quoting_hint() -> None:
    (line,) = problems({True: ["x"]})
    assert "quote it in YAML" in line


def test_all_problems_are_collected_with_their_location() -> None:
    raw = {"a": [], "b": {"exists": "no"}, "c": {"d": {"gt": "now-1m"}}}
    with pytest.raises(TemplateError) as caught:
        compile_pattern(raw, "events[3].pattern")
    assert caught.value.problems == [
        "events[3].pattern.a: must list at least one value",
        'events[3].pattern.b.exists: must be true or false (got "no")',
        'events[3].pattern.c.d.gt: "now-1m" is the old syntax; write "now()-1m"',
    ]


def test_deep_nesting_is_bounded() -> None:
    raw: dict[str, Any] = {"x": [1]}
    for _ in range(40):
        raw = {"n": raw}
    (line,) = problems(raw)
    assert "nested deeper than 32 levels" in line


def test_compiled_patterns_compare_by_content() -> None:
    assert compile_pattern({"a": [1], "b": [2]}) == compile_pattern({"b": [2], "a": [1]})
    assert compile_pattern({"a": [1]}) != compile_pattern({"a": [2]})
    assert hash(compile_pattern({"a": [1]})) == hash(compile_pattern({"a": [1]}))


def test_equality_conditions_for_the_index() -> None:
    compiled = compile_pattern(
        {"a": ["x", 1], "n": {"b": {"equals": [True]}}, "c": {"prefix": ["p"]}, "d": {"gt": 1}}
    )
    assert compiled.equality_conditions() == [
        (("a",), frozenset({"x", ("n", 1)})),
        (("n", "b"), frozenset({("b", True)})),
    ]


@pytest.mark.parametrize(
    ("key", "meant"),
    [("prefx", "prefix"), ("Prefix", "prefix"), ("exist", "exists"), ("equal", "equals"),
     ("sufix", "suffix"), ("GT", "gt"), ("Lte", "lte"), ("prefixes", "prefix")],
)  # fmt: skip
def test_misspelled_operators_are_not_silently_nested_fields(key: str, meant: str) -> None:
    (line,) = problems({"id": {key: ["u"]}})
    assert line.startswith(f'pattern.id.{key}: unknown operator "{key}" (did you mean "{meant}"?')


@pytest.mark.parametrize("key", ["late", "get", "name", "status", "gtx_id"])
def test_ordinary_nested_field_names_stay_fields(key: str) -> None:
    assert matches({"n": {key: [1]}}, {"n": {key: 1}})


def test_top_level_fields_may_be_named_like_operators() -> None:
    assert matches({"prefix": ["a"], "exists": [True]}, {"prefix": "a", "exists": True})
