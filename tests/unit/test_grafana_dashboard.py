"""deploy/grafana/relay.json only asks for series Relay exports.

Every PromQL expression of the dashboard (panel targets and the variables'
``label_values`` queries) is parsed with promql-parser, the Rust PromQL parser's
Python binding: a syntax error fails here, not on an operator's screen. Every
series it selects must be one the metrics registry exposes, named as
prometheus_client exposes it (a counter ``x`` as ``x_total``, a histogram ``h``
as ``h_bucket``, ``h_sum``, ``h_count``). The registry is the one source of the
names: it is read here, not copied.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser

from relay.adapters.metrics.breakers import subscribe_breakers
from relay.adapters.metrics.registry import Metrics
from relay.application.bus import MessageBus

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "relay.json"

# Grafana's own variables, given a value PromQL accepts (they are durations)
GRAFANA_DURATIONS = ("$__rate_interval", "$__interval", "$__range")
LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<expr>.+?)\s*,\s*\w+\s*\)\s*$")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
}


def exported_series() -> frozenset[str]:
    """Every sample name ``GET /metrics`` can show, from the registry's families
    (a family without samples yet still names itself and its type)."""
    names = set()
    metrics = Metrics()
    subscribe_breakers(MessageBus({}), metrics.registry)  # as bootstrap wires them
    for family in metrics.registry.collect():
        for suffix in SUFFIXES[family.type]:
            names.add(family.name + suffix)
    return frozenset(names)


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(where, PromQL)`` for every panel target (rows' nested panels included)
    and every query variable."""
    found: list[tuple[str, str]] = []

    def panels(items: list[dict[str, Any]]) -> None:
        for panel in items:
            for target in panel.get("targets", []):
                found.append((f'panel "{panel.get("title")}"', target.get("expr", "")))
            panels(panel.get("panels", []))

    panels(dashboard.get("panels", []))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        match = LABEL_VALUES.match(text)
        found.append((f'variable "{variable.get("name")}"', match["expr"] if match else text))
    return found


def selected_series(expr: str) -> list[str]:
    """The metric names an expression selects; ``ValueError`` when it does not parse."""
    for variable in GRAFANA_DURATIONS:
        expr = expr.replace(variable, "5m")
    names: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name
            for matcher in node.matchers.matchers:
                if matcher.name == "__name__":
                    name = matcher.value
            names.append(name or "")

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def dashboard_problems(dashboard: dict[str, Any], known: frozenset[str]) -> list[str]:
    problems = []
    for where, expr in expressions(dashboard):
        if not expr.strip():
            problems.append(f"{where}: an empty expression")
            continue
        try:
            names = selected_series(expr)
        except ValueError as exc:
            problems.append(f"{where}: does not parse ({exc}): {expr}")
            continue
        if not names:
            problems.append(f"{where}: selects no series: {expr}")
        problems.extend(
            f"{where}: {name or '(a selector without a name)'} is not a series Relay exports"
            for name in names
            if name not in known
        )
    return problems


def load() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def test_every_expression_parses_and_names_a_series_relay_exports() -> None:
    dashboard = load()
    assert len(expressions(dashboard)) > 20  # the walk still finds the dashboard's queries
    assert dashboard_problems(dashboard, exported_series()) == []


def test_the_dashboard_covers_what_an_operator_watches() -> None:
    used = {name for _, expr in expressions(load()) for name in selected_series(expr)}
    wanted = {
        "events_received_total",  # throughput
        "events_matched_total",  # match rate
        "handler_duration_seconds_bucket",  # latency percentiles
        "function_handler_failure_total",  # failures
        "function_retries_total",  # retries
        "dlq_entries_total",  # DLQ growth
        "pending_entries",  # pending depth
        "pending_oldest_age_seconds",  # oldest age
        "runtime_container_acquires_total",  # warm / cold
        "function_breaker_state",  # breaker state
    }
    assert wanted <= used, wanted - used


def test_a_broken_dashboard_is_caught_line_by_line() -> None:
    def panel(title: str, expr: str) -> dict[str, Any]:
        return {"title": title, "targets": [{"expr": expr}]}

    broken = {
        "panels": [
            panel("typo", "sum(rate(events_recieved_total[$__rate_interval]))"),
            panel("unclosed", "sum(rate(events_received_total[5m])"),
            panel("gauge as counter", "rate(pending_entries_total[5m])"),
            panel("counter without _total", "rate(handler_invocations[5m])"),
            panel("histogram base name", "histogram_quantile(0.9, handler_duration_seconds)"),
            panel("by name matcher", 'sum({__name__="no_such_series"})'),
            panel("no series", "vector(1)"),
            {"type": "row", "title": "a row", "panels": [panel("nested", "up")]},
            panel("fine", "max(pending_oldest_age_seconds) + sum(build_failures_total)"),
        ],
        "templating": {
            "list": [
                {"name": "fn", "type": "query", "query": {"query": "label_values(nope, function)"}}
            ]
        },
    }
    problems = dashboard_problems(broken, exported_series())
    assert problems == [
        'panel "typo": events_recieved_total is not a series Relay exports',
        'panel "unclosed": does not parse (unclosed left parenthesis): '
        "sum(rate(events_received_total[5m])",
        'panel "gauge as counter": pending_entries_total is not a series Relay exports',
        'panel "counter without _total": handler_invocations is not a series Relay exports',
        'panel "histogram base name": handler_duration_seconds is not a series Relay exports',
        'panel "by name matcher": no_such_series is not a series Relay exports',
        'panel "no series": selects no series: vector(1)',
        'panel "nested": up is not a series Relay exports',
        'variable "fn": nope is not a series Relay exports',
    ]


def test_the_names_come_from_the_registry_with_prometheus_client_suffixes() -> None:
    names = exported_series()
    assert {"events_received_total", "handler_duration_seconds_bucket", "pending_entries"} <= names
    # the live collectors (pools, worker gauges) name themselves even with nothing to report
    assert {"runtime_containers", "runtime_pool_capacity", "concurrency_waits_total"} <= names
    assert "events_received" not in names
    assert "pending_entries_total" not in names
