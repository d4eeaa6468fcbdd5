"""The rule index: same result as a linear scan, in function-name then declaration order."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from relay.domain.rule_index import RuleIndex, RuleMatch
from relay.domain.template import Template, parse_template
from tests.unit.test_patterns_properties import NOW, events, object_for, patterns, ref_match


def template(*patterns_: dict[str, Any]) -> Template:
    rules = [{"handler": f"h{i}.main", "pattern": p} for i, p in enumerate(patterns_)]
    return parse_template({"runtime": "node24", "events": rules})


def found(matches: list[RuleMatch]) -> list[tuple[str, str]]:
    return [(m.function, m.rule.handler) for m in matches]


def test_functions_in_name_order_then_rules_in_declaration_order() -> None:
    index = RuleIndex.build(
        [
            ("zeta", template({"t": ["users"]}, {"id": {"prefix": ["u"]}})),
            ("alpha", template({"id": {"exists": True}}, {"t": ["users"]}, {"t": ["orders"]})),
            ("mid", template({"t": ["users"], "e": ["INSERT"]})),
        ]
    )
    event = {"t": "users", "e": "INSERT", "id": "u1"}
    expected = [
        ("alpha", "h0.main"),
        ("alpha", "h1.main"),
        ("mid", "h0.main"),
        ("zeta", "h0.main"),
        ("zeta", "h1.main"),
    ]
    assert found(index.match(event, NOW)) == expected
    assert found(index.match_linear(event, NOW)) == expected
    assert [m.rule_index for m in index.match(event, NOW)] == [0, 1, 0, 0, 1]
    assert len(index) == 6


def test_two_rules_with_the_same_pattern_both_match() -> None:
    doc = {
        "runtime": "node24",
        "events": [
            {"handler": "a.one", "pattern": {"t": ["x"]}},
            {"handler": "a.two", "pattern": {"t": ["x"]}},
        ],
    }
    index = RuleIndex.build([("f", parse_template(doc))])
    assert found(index.match({"t": "x"}, NOW)) == [("f", "a.one"), ("f", "a.two")]


def test_candidates_skip_rules_whose_equality_cannot_hold() -> None:
    functions = [
        (f"fn{i:03d}", template({"table": [f"t{i}"], "op": ["INSERT"]})) for i in range(50)
    ]
    functions.append(("catchall", template({"id": {"prefix": ["u"]}})))
    index = RuleIndex.build(functions)
    candidates = index.candidates({"table": "t7", "op": "INSERT", "id": "x"})
    assert len(candidates) == 2  # fn007 and the rule without equality conditions
    assert found(index.match({"table": "t7", "op": "INSERT"}, NOW)) == [("fn007", "h0.main")]


def test_equality_is_type_preserving_in_the_index_too() -> None:
    index = RuleIndex.build([("f", template({"n": [1]}, {"n": [True]}, {"n": ["1"]}))])
    assert found(index.match({"n": 1.0}, NOW)) == [("f", "h0.main")]
    assert found(index.match({"n": True}, NOW)) == [("f", "h1.main")]
    assert found(index.match({"n": "1"}, NOW)) == [("f", "h2.main")]
    assert index.match({"n": [1]}, NOW) == []
    assert index.match({"n": {"x": 1}}, NOW) == []


def test_nested_equality_paths_and_equals_operators_are_indexed() -> None:
    index = RuleIndex.build(
        [("f", template({"img": {"kind": {"equals": ["a", "b"]}}}, {"img": {"kind": ["c"]}}))]
    )
    assert found(index.match({"img": {"kind": "b"}}, NOW)) == [("f", "h0.main")]
    assert found(index.match({"img": {"kind": "c"}}, NOW)) == [("f", "h1.main")]
    assert index.match({"img": "c"}, NOW) == []
    assert index.match({}, NOW) == []


def test_an_empty_index_matches_nothing() -> None:
    index = RuleIndex.build([])
    assert index.match({"a": 1}, NOW) == []
    assert len(index) == 0


def test_functions_without_event_rules_are_fine() -> None:
    index = RuleIndex.build([("svc", parse_template({"services": [{"image": "nginx"}]}))])
    assert index.match({}, NOW) == []


function_patterns = st.lists(st.lists(patterns, min_size=0, max_size=4), min_size=0, max_size=6)


# Each example builds an index over up to 24 rules and checks many events, so it
# is ~50x the cost of a single-pattern example; a third of the profile's count.
@settings(deadline=None, max_examples=max(20, settings().max_examples // 3))
@given(st.data(), function_patterns)
def test_index_agrees_with_linear_scan_and_reference(
    data: st.DataObject, pattern_lists: list[list[dict[str, Any]]]
) -> None:
    functions = [(f"fn{i}", template(*ps)) for i, ps in enumerate(pattern_lists)]
    index = RuleIndex.build(list(reversed(functions)))
    every = [p for ps in pattern_lists for p in ps]
    guide = st.sampled_from(every).flatmap(object_for) if every else events
    for _ in range(5):
        event = data.draw(st.one_of(guide, events))
        expected = [
            (f"fn{number}", f"h{i}.main")
            for number, ps in sorted(enumerate(pattern_lists), key=lambda item: f"fn{item[0]}")
            for i, p in enumerate(ps)
            if ref_match(p, event)
        ]
        assert found(index.match(event, NOW)) == expected
        assert index.match(event, NOW) == index.match_linear(event, NOW)
