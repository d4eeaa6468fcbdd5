"""``docs/schemas/template.schema.json``: generated from the template types, current,
accepting every example template and rejecting the invalid template fixtures.

The schema must never flag a template Relay accepts (an editor would show a false
error), so every valid template here also parses; every invalid fixture is refused by
both the schema and :func:`parse_template`, so the two cannot disagree on them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from relay.domain.errors import TemplateError
from relay.domain.template import parse_template
from relay.domain.template_schema import render, template_schema

REPO = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO / "docs" / "schemas" / "template.schema.json"
EXAMPLES = sorted((REPO / "examples" / "functions").glob("*/template.yaml"))
IMAGE_FIXTURES = sorted((REPO / "tests" / "integration" / "image_fixtures").glob("*/template.yaml"))
MODELINE = "# yaml-language-server: $schema="

RULE = {"handler": "events.created.handler", "pattern": {"event_name": ["INSERT"]}}
SCHEDULE = {"handler": "jobs.a.b", "cron": "* * * * *"}


def rule(**changes: object) -> dict[str, Any]:
    return {"runtime": "python3.14", "events": [{**RULE, **changes}]}


def schedule(**changes: object) -> dict[str, Any]:
    return {"runtime": "python3.14", "schedules": [{**SCHEDULE, **changes}]}


def service(**fields: object) -> dict[str, Any]:
    return {"runtime": "node24", "services": [fields]}


# The invalid template fixtures of the template tests, by the test that holds each
# (tests/unit/test_template*.py, tests/e2e/test_function_authoring_cli.py::BROKEN,
# tests/unit/test_catalog_status.py::INVALID, tests/integration/test_match_dry_run_redis.py).
INVALID: dict[str, object] = {
    "document is null (empty file)": None,
    "document is a list": [],
    "document is a string": "runtime: x",
    "document is a number": 3,
    "unknown top-level key event": {"runtime": "node24", "event": []},
    "unknown top-level key zzz": {"runtime": "node24", "zzz": []},
    "runtime python3.12": {"runtime": "python3.12", "services": [{"image": "nginx:1.27"}]},
    "runtime Python3.14": {"runtime": "Python3.14"},
    "runtime number": {"runtime": 3.14},
    "runtime missing with events": {"events": [RULE]},
    "runtime missing with schedules": {"schedules": [SCHEDULE]},
    "runtime missing with an entrypoint": {"services": [{"entrypoint": "service.js"}]},
    "concurrency 0": {"concurrency": 0},
    "concurrency float": {"concurrency": 1.5},
    "concurrency bool": {"concurrency": True},
    "concurrency string": {"concurrency": "2"},
    "events is a number": {"runtime": "python3.14", "events": 5},
    "events entry is a string": {"runtime": "python3.14", "events": ["x"]},
    "handler without a dot": rule(handler="handler"),
    "handler starting with a dot": rule(handler=".main"),
    "handler ending with a dot": rule(handler="handler."),
    "handler with a space": rule(handler="a b"),
    "handler with an empty part": rule(handler="a..b"),
    "handler function starting with a digit": rule(handler="a.1fn"),
    "handler function with a dash": rule(handler="a.b-c"),
    "handler empty": rule(handler=""),
    "handler number": rule(handler=3),
    "handler list": rule(handler=["a.b"]),
    "handler with a newline": rule(handler="a.b\n"),
    "handler missing": {"runtime": "python3.14", "events": [{"pattern": {"a": ["b"]}}]},
    "pattern missing": {"runtime": "python3.14", "events": [{"handler": "a.b"}]},
    "pattern empty": rule(pattern={}),
    "pattern bare scalar": rule(pattern={"x": 1}),
    "pattern empty list": rule(pattern={"x": []}),
    "pattern nested list value": rule(pattern={"x": [[1]]}),
    "unknown rule key": rule(evnt="x"),
    "timeout number": rule(timeout=20),
    "timeout not a duration": rule(timeout="20 seconds"),
    "retries negative": rule(retries=-1),
    "retries float": rule(retries=1.5),
    "retries string": rule(retries="3"),
    "retries null": rule(retries=None),
    "cron missing": {"runtime": "python3.14", "schedules": [{"handler": "a.b"}]},
    "cron number": schedule(cron=5),
    "overlap other": schedule(overlap="queue"),
    "catchup number": schedule(catchup=30),
    "timezone empty": schedule(timezone=""),
    "env value a number": {"env": {"A": 1}},
    "env value a boolean": {"env": {"A": True}},
    "env nested value": {"env": {"A": {"b": "c"}}},
    "env name invalid": {"env": {"1A": "x"}},
    "env is a list": {"env": ["A=b"]},
    "secret reference uppercase": {"secrets": {"A": "Bad"}},
    "secret reference hidden": {"secrets": {"A": ".hidden"}},
    "secret reference with a slash": {"secrets": {"A": "x/y"}},
    "secret reference empty": {"secrets": {"A": ""}},
    "secret reference too long": {"secrets": {"A": "a" * 64}},
    "secret reference number": {"secrets": {"A": 3}},
    "service with two sources": service(entrypoint="service.js", build="Dockerfile"),
    "service with no source": service(port=80),
    "service port 0": service(image="nginx:1.27", port=0),
    "service port too high": service(image="nginx:1.27", port=70000),
    "service replicas 0": service(image="nginx:1.27", replicas=0),
    "service source empty": service(image=""),
    "service path without a slash": service(image="nginx:1.27", host="a.example", path="v2"),
    "service unknown key": service(image="nginx:1.27", ports=80),
    "breaker true": {"runtime": "node24", "breaker": True},
    "breaker list": {"runtime": "node24", "breaker": []},
    "breaker failures 0": {"breaker": {"failures": 0}},
    "breaker failures too many": {"breaker": {"failures": 1001}},
    "breaker window number": {"breaker": {"window": 60}},
    "breaker unknown key": {"breaker": {"failure": 5}},
    "BROKEN of test_function_authoring_cli": yaml.safe_load(
        "runtime: python3.12\nevents:\n  - handler: handler\n    pattern: {x: 1}\n    "
        "timeout: 10m\n"
    ),
    "INVALID of test_catalog_status": yaml.safe_load(
        "runtime: python3.14\nevents:\n  - handler: main\n    pattern: {x: [1]}\n"
    ),
}

VALID: dict[str, object] = {
    "empty map": {},
    "services without a runtime": {"services": [{"build": "Dockerfile"}, {"image": "a/b:1"}]},
    "null sections": {"runtime": "node24", "events": None, "env": None, "breaker": None},
    "empty env value": {"env": {"FLAG": None}},
    "breaker on with defaults": {"breaker": {}},
    "every breaker key": {
        "breaker": {"failures": 3, "window": "2m", "cooldown": "1m", "max_cooldown": "1h"}
    },
    "every schedule key": schedule(
        timezone="Europe/Rome", timeout="1m30s", retries=0, catchup="2h", overlap="skip"
    ),
    "catchup zero": schedule(catchup=0),
    "operators and nested fields": rule(
        pattern={"a": {"prefix": ["x"]}, "b": {"c": [1, None, True]}, "d": {"exists": True}}
    ),
    "node module with a dash": {"runtime": "node24", "events": [{**RULE, "handler": "my-mod.h"}]},
    "routed service": service(image="nginx:1.27", host="api.example.com", path="/v2"),
}


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_schema_file_is_what_the_template_types_generate() -> None:
    assert SCHEMA_FILE.read_text() == render(), "stale: run scripts/template-schema"
    assert template_schema()["additionalProperties"] is False


@pytest.mark.parametrize("path", EXAMPLES + IMAGE_FIXTURES, ids=lambda p: p.parent.name)
def test_every_example_template_matches_the_schema(
    path: Path, validator: jsonschema.Draft202012Validator
) -> None:
    document = yaml.safe_load(path.read_text())
    parse_template(document)  # and Relay accepts it too
    validator.validate(document)


def test_there_are_examples_to_check() -> None:
    assert len(EXAMPLES) >= 7
    assert IMAGE_FIXTURES


@pytest.mark.parametrize("name", VALID)
def test_templates_relay_accepts_match_the_schema(
    name: str, validator: jsonschema.Draft202012Validator
) -> None:
    parse_template(VALID[name])
    validator.validate(VALID[name])


@pytest.mark.parametrize("name", INVALID)
def test_the_invalid_fixtures_are_refused_by_the_schema_and_by_relay(
    name: str, validator: jsonschema.Draft202012Validator
) -> None:
    document = INVALID[name]
    with pytest.raises(TemplateError):
        parse_template(document)
    assert not validator.is_valid(document), f"the schema accepts {name}: {document!r}"


def test_the_docs_give_the_editor_line_and_it_resolves_from_an_example(
    validator: jsonschema.Draft202012Validator,
) -> None:
    """templates.md shows the line to put at the top of a template; the relative path
    it gives for a function directory in examples/functions/ reaches the schema file."""
    text = (REPO / "docs" / "templates.md").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(MODELINE)]
    assert lines, "docs/templates.md shows no yaml-language-server line"
    relative = [line.removeprefix(MODELINE) for line in lines if line.startswith(f"{MODELINE}../")]
    assert relative
    for target in relative:
        assert (EXAMPLES[0].parent / target).resolve() == SCHEMA_FILE


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_every_example_names_the_schema_on_its_first_line(path: Path) -> None:
    """So an editor opened on an example checks it, and a copied example carries the
    line along (its path is right for a function in examples/functions/)."""
    first = path.read_text().splitlines()[0]
    assert first.startswith(MODELINE)
    assert (path.parent / first.removeprefix(MODELINE)).resolve() == SCHEMA_FILE
