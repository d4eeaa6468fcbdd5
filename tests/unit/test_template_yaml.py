"""Reading template.yaml: YAML errors, size and depth caps, YAML typing traps."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.adapters.fs.templates import (
    MAX_TEMPLATE_BYTES,
    load_template,
    load_template_text,
)
from relay.domain.errors import TemplateError

SPEC_EXAMPLE = """\
runtime: python3.14
concurrency: 2
events:
  - handler: events.created.handler
    pattern:
      event_name: [INSERT]
      table_name: [users]
  - handler: events.updated.handler
    pattern:
      event_name: [MODIFY]
      table_name: [users]
    timeout: 20s
schedules:
  - handler: jobs.report.handler
    cron: "0 8 * * 1-5"
    timezone: "Europe/Rome"
services:
  - entrypoint: service.js
    port: 3000
    replicas: 2
env:
  API_URL: https://api.example.com
  FLAG:
secrets:
  DATABASE_URL: database-url
"""


def problems(text: str) -> list[str]:
    with pytest.raises(TemplateError) as caught:
        load_template_text(text)
    return caught.value.problems


def test_the_spec_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_text(SPEC_EXAMPLE)
    template = load_template(path)
    assert [r.handler for r in template.events] == [
        "events.created.handler",
        "events.updated.handler",
    ]
    assert template.env == {"API_URL": "https://api.example.com", "FLAG": ""}
    assert template.schedules[0].timezone == "Europe/Rome"


def test_yaml_syntax_errors_name_the_file_and_line() -> None:
    (line,) = problems("runtime: node24\nevents:\n  - handler: a.b\n   pattern: [\n")
    assert line.startswith("template.yaml:4: invalid YAML: ")


def test_source_names_the_file_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_text("a: [\n")
    with pytest.raises(TemplateError) as caught:
        load_template(path)
    (line,) = caught.value.problems
    assert line.startswith(f"{path}:")


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(TemplateError) as caught:
        load_template(tmp_path / "template.yaml")
    (line,) = caught.value.problems
    assert "cannot be read" in line


def test_size_cap(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_text("runtime: node24\n" + "#" * MAX_TEMPLATE_BYTES)
    with pytest.raises(TemplateError, match="larger than 256 KiB"):
        load_template(path)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_bytes(b"runtime: \xff\n")
    with pytest.raises(TemplateError, match="not UTF-8"):
        load_template(path)


def test_depth_cap() -> None:
    (line,) = problems("a: " + "[" * 100 + "]" * 100 + "\n")
    assert "nested deeper than 64 levels" in line


def test_alias_expansion_is_bounded() -> None:
    lines = ["a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"]
    for name, prev in zip("bcdefg", "abcdef", strict=True):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    (line,) = problems("\n".join(lines) + "\n")
    assert "expands to more than" in line


def test_python_tags_are_refused() -> None:
    (line,) = problems("runtime: !!python/object:os.system {}\n")
    assert "invalid YAML" in line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # YAML 1.1 reads these as booleans or numbers, which the template rejects clearly
        ("runtime: node24\nenv:\n  DEBUG: yes\n",
         "env.DEBUG: value must be a string, but YAML read the boolean true (from an unquoted "
         "yes/no/on/off/true/false); put it in quotes"),
        ("runtime: node24\nenv:\n  PORT: 8080\n",
         "env.PORT: value must be a string, but YAML read the number 8080; "
         'put it in quotes: "8080"'),
        ("runtime: node24\nevents:\n  - handler: a.b\n    pattern:\n      on: [x]\n", None),
        ("runtime: node24\nevents:\n  - handler: a.b\n    pattern: {x: [1]}\n    timeout: 20\n",
         'events[0].timeout: must be a Go duration string such as "20s" (got 20)'),
    ],
)  # fmt: skip
def test_yaml_typing_traps_are_reported(text: str, expected: str | None) -> None:
    (line,) = problems(text)
    if expected is not None:
        assert line == expected
    else:
        assert "quote it in YAML" in line


def test_empty_file() -> None:
    assert problems("") == ["template: is empty (it needs at least a runtime and events)"]
    assert problems("# only a comment\n") == problems("")


def test_multiple_documents_are_rejected() -> None:
    (line,) = problems("runtime: node24\n---\nruntime: python3.14\n")
    assert "invalid YAML" in line


def test_unquoted_dates_are_named_as_yaml_timestamps() -> None:
    (line,) = problems("runtime: node24\nenv:\n  SINCE: 2026-01-01\n")
    assert (
        line == "env.SINCE: value must be a string (got the YAML timestamp 2026-01-01; "
        "quote it for text)"
    )
    (line,) = problems(
        "runtime: node24\nevents:\n  - handler: a.b\n    pattern:\n"
        "      t: {gt: 2026-01-01T00:00:00Z}\n"
    )
    assert line.startswith(
        "events[0].pattern.t.gt: YAML read the timestamp 2026-01-01T00:00:00+00:00"
    )


def test_the_yaml_examples_in_the_docs_are_valid() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "templates.md").read_text()
    blocks = docs.split("```yaml\n")[1:]
    complete = [b.split("```")[0] for b in blocks if b.startswith("runtime:")]
    assert complete, "docs/templates.md should show a complete template"
    for text in complete:
        load_template_text(text, "docs/templates.md")


HUGE = "1" * 4301


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("concurrency: 2024-02-30", "\"2024-02-30\" is not a valid date or time"),
        ("concurrency: 2024-01-01 25:61:61", "\"2024-01-01 25:61:61\" is not a valid date"),
        (f"concurrency: {HUGE}", "has 4301 digits, more than the 4300 allowed"),
        (f"concurrency: -{HUGE}", "has 4301 digits"),
    ],
)
def test_values_pyyaml_cannot_construct_are_one_located_line(line: str, expected: str) -> None:
    text = f"runtime: python3.14\n{line}\nevents: []\n"
    [problem] = problems(text)
    assert problem.startswith("template.yaml:2: invalid YAML: ")
    assert expected in problem
    assert "\n" not in problem
    assert HUGE not in problem  # a 4,300-digit echo is no one's clear line


def test_an_invalid_date_deep_in_a_pattern_names_its_line() -> None:
    text = (
        "runtime: python3.14\nevents:\n  - handler: a.b\n"
        "    pattern:\n      day: [2024-02-30]\n"
    )
    assert problems(text) == [
        'template.yaml:5: invalid YAML: "2024-02-30" is not a valid date or time '
        "(day is out of range for month); quote it to keep it as text"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "runtime: python3.14\nevents: []\nruntime: node24\n",
            'template.yaml:3: invalid YAML: duplicate key "runtime" (first at line 1)',
        ),
        (
            "runtime: python3.14\nevents:\n  - handler: a.b\n    pattern:\n"
            "      kind: [x]\n      kind: [y]\n",
            'template.yaml:6: invalid YAML: duplicate key "kind" (first at line 5)',
        ),
        (
            "runtime: python3.14\nenv: {A: x, B: y, A: z}\n",
            'template.yaml:2: invalid YAML: duplicate key "A" (first at line 2)',
        ),
    ],
)
def test_a_duplicate_key_is_an_error_with_both_lines(text: str, expected: str) -> None:
    assert problems(text) == [expected]


def test_a_key_brought_in_by_a_merge_may_be_overridden() -> None:
    text = (
        "runtime: python3.14\n"
        "events:\n"
        "  - &rule {handler: a.b, retries: 1, pattern: {kind: [x]}}\n"
        "  - <<: *rule\n"
        "    handler: a.c\n"
        "    retries: 2\n"
        "    pattern: {kind: [y]}\n"
    )
    template = load_template_text(text)
    assert [(r.handler, r.retries) for r in template.events] == [("a.b", 1), ("a.c", 2)]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("!!bool maybe", '"maybe" cannot be read as !!bool (KeyError)'),
        ("!!timestamp soon", '"soon" is not a valid date or time; quote it'),
        ("!!int ''", '"" cannot be read as !!int (IndexError)'),
    ],
)
def test_any_other_constructor_failure_is_a_located_line(
    tmp_path: Path, value: str, expected: str
) -> None:
    path = tmp_path / "template.yaml"
    path.write_text(f"runtime: python3.14\nconcurrency: {value}\n")
    with pytest.raises(TemplateError) as caught:
        load_template(path)
    [problem] = caught.value.problems
    assert problem.startswith(f"{path}:2: invalid YAML: ")
    assert expected in problem
