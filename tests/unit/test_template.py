"""Template validation: every rule with its accepted and rejected forms."""

from __future__ import annotations

from typing import Any

import pytest

from relay.domain.durations import MINUTE, SECOND
from relay.domain.errors import TemplateError
from relay.domain.template import (
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_NS,
    MAX_TIMEOUT_NS,
    SUPPORTED_RUNTIMES,
    Template,
    parse_template,
)

RULE = {"handler": "events.created.handler", "pattern": {"event_name": ["INSERT"]}}


def problems(doc: object) -> list[str]:
    with pytest.raises(TemplateError) as caught:
        parse_template(doc)
    return caught.value.problems


def with_rule(**fields: Any) -> dict[str, Any]:
    return {"runtime": "python3.14", "events": [{**RULE, **fields}]}


def with_schedule(**fields: Any) -> dict[str, Any]:
    entry = {"handler": "jobs.cleanup.handler", "cron": "0 3 * * *", **fields}
    return {"runtime": "python3.14", "schedules": [entry]}


def test_the_spec_example_parses_with_its_defaults() -> None:
    template = parse_template(
        {
            "runtime": "python3.14",
            "concurrency": 2,
            "events": [
                {"handler": "events.created.handler", "pattern": {"event_name": ["INSERT"]}},
                {
                    "handler": "events.updated.handler",
                    "pattern": {"event_name": ["MODIFY"], "table_name": ["users"]},
                    "timeout": "20s",
                },
            ],
            "schedules": [
                {"handler": "jobs.cleanup.handler", "cron": "0 3 * * *"},
                {
                    "handler": "jobs.report.handler",
                    "cron": "0 8 * * 1-5",
                    "timezone": "Europe/Rome",
                    "timeout": "20s",
                },
            ],
            "services": [{"entrypoint": "service.js", "port": 3000, "replicas": 2}],
        }
    )
    first, second = template.events
    assert first.handler == "events.created.handler"
    assert (first.module, first.function) == ("events.created", "handler")
    assert first.timeout_ns == DEFAULT_TIMEOUT_NS == 6 * SECOND
    assert first.retries == DEFAULT_RETRIES == 4
    assert first.raw_pattern == {"event_name": ["INSERT"]}
    assert second.timeout_ns == 20 * SECOND
    cleanup, report = template.schedules
    assert (cleanup.timezone, cleanup.timeout_ns, cleanup.retries) == ("UTC", 6 * SECOND, 4)
    assert (report.timezone, report.timeout_ns) == ("Europe/Rome", 20 * SECOND)
    assert template.services[0].port == 3000
    assert template.concurrency == 2


def test_defaults_of_a_minimal_template() -> None:
    template = parse_template({"runtime": "node24"})
    assert template == Template(runtime="node24")
    assert template.concurrency == 2
    assert (template.events, template.schedules, template.services) == ((), (), ())
    assert (template.env, template.secrets) == ({}, {})


def test_every_problem_is_reported_not_only_the_first() -> None:
    found = problems(
        {
            "runtime": "python2",
            "concurrency": 0,
            "events": [{"handler": "handler", "pattern": {"a": "x"}, "timeout": "10m"}],
            "env": {"1BAD": "x"},
        }
    )
    assert found == [
        'runtime: "python2" is not supported (use python3.14 or node24)',
        "concurrency: must be a positive integer (got 0)",
        'events[0].handler: "handler" must be module.function, e.g. events.created.handler',
        "events[0].pattern.a: must be a list of values, a map of operators or a map of nested "
        'fields (got "x"; write [x] for equality)',
        'events[0].timeout: must be at most 5m (got "10m")',
        'env: "1BAD" is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)',
    ]


@pytest.mark.parametrize("doc", [None, [], "runtime: x", 3])
def test_the_document_must_be_a_map(doc: object) -> None:
    (line,) = problems(doc)
    assert line.startswith("template: ")


@pytest.mark.parametrize(
    ("key", "hint"),
    [("event", 'did you mean "events"?'), ("schedule", 'did you mean "schedules"?'), ("zzz", "")],
)
def test_unknown_top_level_keys_are_errors(key: str, hint: str) -> None:
    (line,) = problems({"runtime": "node24", key: []})
    assert line.startswith(f"{key}: unknown key")
    assert hint in line


# --- runtime --------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", SUPPORTED_RUNTIMES)
def test_supported_runtimes(runtime: str) -> None:
    assert parse_template({"runtime": runtime, "events": [RULE]}).runtime == runtime


@pytest.mark.parametrize("runtime", ["python3.12", "node", "Python3.14", "", None, 3.14, True])
def test_any_other_runtime_fails_even_when_not_required(runtime: object) -> None:
    (line,) = problems({"runtime": runtime, "services": [{"image": "nginx:1.27"}]})
    assert line.startswith("runtime: ")
    assert "is not supported" in line


@pytest.mark.parametrize(
    "doc",
    [
        {"events": [RULE]},
        {"schedules": [{"handler": "jobs.a.b", "cron": "* * * * *"}]},
        {"services": [{"entrypoint": "service.js"}]},
        {"services": [{"image": "nginx:1.27"}, {"entrypoint": "app/main.py"}]},
        {"events": [{"handler": "bad"}]},  # required even when the rule itself is invalid
    ],
)
def test_runtime_is_required_for_events_schedules_and_entrypoint_services(doc: object) -> None:
    assert any(line.startswith("runtime: is required") for line in problems(doc))


@pytest.mark.parametrize(
    "doc",
    [
        {"services": [{"image": "nginx:1.27"}]},
        {"services": [{"build": "Dockerfile"}, {"image": "ghcr.io/acme/api:1.2"}]},
        {"env": {"A": "b"}},
        {},
    ],
)
def test_runtime_is_not_required_otherwise(doc: dict[str, Any]) -> None:
    assert parse_template(doc).runtime is None


# --- concurrency ----------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 2, 15, 1000])
def test_concurrency_accepts_positive_integers(value: int) -> None:
    assert parse_template({"runtime": "node24", "concurrency": value}).concurrency == value


@pytest.mark.parametrize("value", [0, -1, 1.5, 2.0, True, False, "2", None, [2]])
def test_concurrency_rejects_everything_else(value: object) -> None:
    (line,) = problems({"runtime": "node24", "concurrency": value})
    assert line.startswith("concurrency: must be a positive integer")


# --- handlers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "handler", ["events.created.handler", "handler.handler", "a.b", "_m.f", "pkg.sub.mod.fn_2"]
)
def test_valid_handlers(handler: str) -> None:
    (rule,) = parse_template(with_rule(handler=handler)).events
    assert rule.handler == handler
    assert f"{rule.module}.{rule.function}" == handler


def test_handler_splits_at_the_last_dot() -> None:
    (rule,) = parse_template(with_rule(handler="events.created.handler")).events
    assert (rule.module, rule.function) == ("events.created", "handler")


@pytest.mark.parametrize(
    "handler",
    [
        "handler",
        ".main",
        "handler.",
        "a b",
        "a..b",
        "a.1fn",
        "a.b-c",
        "",
        3,
        None,
        ["a.b"],
        "a.b\n",
    ],
)
def test_invalid_handlers(handler: object) -> None:
    (line,) = problems(with_rule(handler=handler))
    assert line.startswith("events[0].handler: ")


def test_python_modules_must_be_identifiers_but_node_modules_may_have_dashes() -> None:
    (line,) = problems(with_rule(handler="my-module.handler"))
    assert "not a valid Python identifier" in line
    doc = with_rule(handler="my-module.handler")
    doc["runtime"] = "node24"
    assert parse_template(doc).events[0].module == "my-module"


def test_handler_and_pattern_are_required() -> None:
    found = problems({"runtime": "node24", "events": [{}]})
    assert found == [
        "events[0].handler: is required (module.function, e.g. events.created.handler)",
        "events[0].pattern: is required (a map of field conditions)",
    ]


def test_duplicate_handlers_in_one_function_are_an_error() -> None:
    doc = {"runtime": "node24", "events": [RULE, {**RULE, "pattern": {"x": [1]}}, RULE]}
    assert problems(doc) == [
        'events[1].handler: duplicate handler "events.created.handler" (also events[0])',
        'events[2].handler: duplicate handler "events.created.handler" (also events[0])',
    ]


def test_a_handler_may_serve_both_an_event_rule_and_a_schedule() -> None:
    doc = with_schedule(handler=RULE["handler"])
    doc["events"] = [RULE]
    assert len(parse_template(doc).schedules) == 1


def test_duplicate_schedule_handlers_are_an_error() -> None:
    doc = with_schedule()
    doc["schedules"].append({"handler": "jobs.cleanup.handler", "cron": "0 4 * * *"})
    assert problems(doc) == [
        'schedules[1].handler: duplicate handler "jobs.cleanup.handler" (also schedules[0])'
    ]


@pytest.mark.parametrize("section", ["events", "schedules", "services"])
def test_sections_must_be_lists_of_maps(section: str) -> None:
    assert problems({"runtime": "node24", section: {"handler": "a.b"}}) == [
        f"{section}: must be a list (got a map)"
    ]
    assert problems({"runtime": "node24", section: ["a.b"]}) == [
        f'{section}[0]: must be a map (got "a.b")'
    ]


def test_empty_sections_are_fine() -> None:
    template = parse_template({"runtime": "node24", "events": None, "schedules": []})
    assert template.events == ()


def test_unknown_rule_keys_are_errors() -> None:
    (line,) = problems(with_rule(timout="5s"))
    assert line.startswith('events[0].timout: unknown key (did you mean "timeout"?')


# --- timeout and retries --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("20s", 20 * SECOND),
        ("1m30s", 90 * SECOND),
        ("5m", 5 * MINUTE),
        ("300s", 5 * MINUTE),
        ("1.5s", 1_500_000_000),
        ("250ms", 250_000_000),
        ("1ns", 1),
    ],
)
def test_timeouts_accepted(text: str, ns: int) -> None:
    assert parse_template(with_rule(timeout=text)).events[0].timeout_ns == ns
    assert parse_template(with_schedule(timeout=text)).schedules[0].timeout_ns == ns


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("0s", "must be positive"),
        ("-5s", "must be positive"),
        ("5m1s", "must be at most 5m"),
        ("1h", "must be at most 5m"),
        ("ten seconds", "is not a Go duration"),
        ("20", "is not a Go duration"),
        ("", "is not a Go duration"),
        (20, "must be a Go duration string"),
        (None, "must be a Go duration string"),
    ],
)
def test_timeouts_rejected(value: object, reason: str) -> None:
    for doc, where in (
        (with_rule(timeout=value), "events"),
        (with_schedule(timeout=value), "schedules"),
    ):
        (line,) = problems(doc)
        assert line.startswith(f"{where}[0].timeout: ")
        assert reason in line


def test_max_timeout_is_five_minutes() -> None:
    assert MAX_TIMEOUT_NS == 5 * MINUTE


@pytest.mark.parametrize("value", [0, 1, 4, 10])
def test_retries_accepted(value: int) -> None:
    assert parse_template(with_rule(retries=value)).events[0].retries == value
    assert parse_template(with_schedule(retries=value)).schedules[0].retries == value


@pytest.mark.parametrize("value", [-1, "abc", 1.5, 2.0, True, None, "3"])
def test_retries_rejected(value: object) -> None:
    (line,) = problems(with_rule(retries=value))
    assert line.startswith("events[0].retries: must be a non-negative integer")


# --- schedules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cron",
    ["0 3 * * *", "0 8 * * 1-5", "*/5 * * * *", "30 0 3 * * *", "0 0 1 1 *", "0 9 * * MON-FRI"],
)
def test_cron_accepted(cron: str) -> None:
    assert parse_template(with_schedule(cron=cron)).schedules[0].cron == cron


def test_six_field_cron_has_seconds_first() -> None:
    (rule,) = parse_template(with_schedule(cron="30 0 3 * * *")).schedules
    assert rule.has_seconds
    # seconds at the end would make "0 3 * * * 90" invalid; at the start it is 90 -> invalid
    assert problems(with_schedule(cron="90 0 3 * * *"))[0].startswith("schedules[0].cron: ")


@pytest.mark.parametrize(
    ("cron", "reason"),
    [
        ("0 3 * *", "must have 5 fields"),
        ("0 0 3 * * * 2026", "must have 5 fields"),
        ("@daily", "must have 5 fields"),
        ("61 * * * *", "is not a valid cron expression"),
        ("0 25 * * *", "is not a valid cron expression"),
        ("a b c d e", "is not a valid cron expression"),
        ("0 0 30 2 *", "never fires"),
        ("", "must have 5 fields"),
        (5, "must be a cron string"),
    ],
)
def test_cron_rejected(cron: object, reason: str) -> None:
    (line,) = problems(with_schedule(cron=cron))
    assert line.startswith("schedules[0].cron: ")
    assert reason in line


def test_cron_is_required() -> None:
    doc = {"runtime": "node24", "schedules": [{"handler": "a.b"}]}
    assert problems(doc) == ['schedules[0].cron: is required (e.g. "0 3 * * *")']


@pytest.mark.parametrize("zone", ["Europe/Rome", "America/Sao_Paulo", "UTC", "Asia/Tokyo"])
def test_timezones_accepted(zone: str) -> None:
    assert parse_template(with_schedule(timezone=zone)).schedules[0].timezone == zone


@pytest.mark.parametrize(
    "zone", ["Mars/Base", "", "Europe/../etc/passwd", "/etc/localtime", 1, None]
)
def test_timezones_rejected(zone: object) -> None:
    (line,) = problems(with_schedule(timezone=zone))
    assert line.startswith("schedules[0].timezone: ")


# --- env and secrets ------------------------------------------------------------------


def test_env_and_secrets() -> None:
    doc = with_rule()
    doc["env"] = {"API_URL": "https://api.example.com", "FLAG": "", "EMPTY": None}
    doc["secrets"] = {"DATABASE_URL": "database-url"}
    template = parse_template(doc)
    assert template.env == {"API_URL": "https://api.example.com", "FLAG": "", "EMPTY": ""}
    assert template.secrets == {"DATABASE_URL": "database-url"}


@pytest.mark.parametrize(
    ("value", "read"),
    [(8080, 'the number 8080; put it in quotes: "8080"'), (1.5, "the number 1.5"),
     (True, "the boolean true"), (False, "the boolean false")],
)  # fmt: skip
def test_non_string_env_values_are_rejected_with_a_quote_hint(value: object, read: str) -> None:
    doc = with_rule()
    doc["env"] = {"PORT": value}
    (line,) = problems(doc)
    assert line.startswith(f"env.PORT: value must be a string, but YAML read {read}")
    assert "quotes" in line


def test_nested_env_values_are_rejected() -> None:
    doc = with_rule()
    doc["env"] = {"A": {"b": 1}, "B": [1]}
    assert problems(doc) == [
        "env.A: value must be a string (got a map)",
        "env.B: value must be a string (got a list)",
    ]


@pytest.mark.parametrize("section", ["env", "secrets"])
def test_variable_names_are_checked(section: str) -> None:
    doc = with_rule()
    doc[section] = {"1X": "a", "A-B": "a", 3: "a"}
    found = problems(doc)
    assert len(found) == 3
    assert all(line.startswith(f"{section}: ") for line in found)


@pytest.mark.parametrize("section", ["env", "secrets"])
def test_relay_handler_is_reserved(section: str) -> None:
    doc = with_rule()
    doc[section] = {"RELAY_HANDLER": "x"}
    assert problems(doc) == [f"{section}.RELAY_HANDLER: is reserved by Relay"]


def test_a_name_in_both_env_and_secrets_is_an_error() -> None:
    doc = with_rule()
    doc["env"] = {"TOKEN": "x"}
    doc["secrets"] = {"TOKEN": "api-token"}
    assert problems(doc) == ["secrets.TOKEN: is also set in env; define a variable in one place"]


@pytest.mark.parametrize("ref", ["Bad", ".hidden", "x/y", "", "a" * 64, 3, None])
def test_secret_references_must_be_secret_names(ref: object) -> None:
    doc = with_rule()
    doc["secrets"] = {"DB": ref}
    (line,) = problems(doc)
    assert line.startswith("secrets.DB: ")


def test_a_credential_given_as_a_secret_reference_is_never_echoed() -> None:
    """Row 232: a connection URL pasted where the secret's name belongs."""
    doc = with_rule()
    doc["secrets"] = {"DB": "postgres://admin:hunter2@db/x"}
    assert problems(doc) == [
        "secrets.DB: invalid secret name (29 characters, not shown):"
        " may contain only lowercase letters, digits, '.', '_' and '-'"
    ]


@pytest.mark.parametrize("section", ["env", "secrets"])
def test_env_and_secrets_must_be_maps(section: str) -> None:
    doc = with_rule()
    doc[section] = ["A=b"]
    assert problems(doc) == [f"{section}: must be a map of NAME: value (got a list)"]


@pytest.mark.parametrize("handler", ["class.handler", "events.import.main", "events.handler.def"])
def test_python_keywords_cannot_be_handler_parts(handler: str) -> None:
    (line,) = problems(with_rule(handler=handler))
    assert line.startswith("events[0].handler: ")
    doc = with_rule(handler=handler)
    doc["runtime"] = "node24"
    assert parse_template(doc).events[0].handler == handler
