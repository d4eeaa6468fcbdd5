"""``relay function validate --json`` (checked against docs/schemas) and
``--format github`` (Actions annotations on the template's line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from relay.adapters.fs.templates import field_line
from relay.entrypoints.cli import app
from relay.entrypoints.cli.fn_validate import _escape
from tests.json_schemas import assert_matches_schema

REPO = Path(__file__).resolve().parents[2]
BAD = """\
runtime: python3.14
events:
  - handler: events.created.handler
    pattern:
      table_name: users
"""


@pytest.fixture
def functions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # annotation paths are relative to the checkout
    root = Path("functions")
    for name, text in {"bad": BAD, "broken": "runtime: python3.14\nevents: [\n"}.items():
        (root / name).mkdir(parents=True)
        (root / name / "template.yaml").write_text(text)
    return root


def run(*args: str) -> Any:
    return CliRunner().invoke(app, ["function", "validate", *args])


def test_json_lists_each_problem_with_its_field_and_line(functions: Path) -> None:
    result = run(str(functions), "missing-dir", "--json")
    assert result.exit_code == 1
    document = assert_matches_schema(result.stdout)
    assert document["ok"] is False
    by_name = {f["name"]: f for f in document["functions"]}
    [bad] = by_name["bad"]["problems"]
    assert (bad["field"], bad["line"]) == ("events[0].pattern.table_name", 5)
    [broken] = by_name["broken"]["problems"]
    assert broken["message"].startswith("invalid YAML: ")
    assert (broken["field"], broken["line"]) == (None, 3)
    assert document["errors"] == [
        {"path": "missing-dir", "message": "missing-dir: no such file or directory"}
    ]
    assert result.stderr == "relay: missing-dir: no such file or directory\n"


def test_json_of_the_examples_is_ok() -> None:
    result = run(str(REPO / "examples" / "functions"), "--json")
    assert result.exit_code == 0, result.output
    document = assert_matches_schema(result.stdout)
    assert document["ok"] is True
    assert document["functions"]
    assert all(f["ok"] and f["problems"] == [] for f in document["functions"])


def test_github_format_annotates_the_template_line(functions: Path) -> None:
    result = run(str(functions), "--format", "github")
    assert result.exit_code == 1
    bad, broken = result.stdout.splitlines()
    assert bad.startswith(
        "::error file=functions/bad/template.yaml,line=5,title=relay function validate::"
        "bad: events[0].pattern.table_name: must be a list"
    )
    assert broken.startswith(
        "::error file=functions/broken/template.yaml,line=3,title=relay function validate::"
        "broken: invalid YAML: "
    )


def test_github_format_escapes_what_would_end_the_command() -> None:
    # a newline in a message would end the workflow command; % is GitHub's escape
    assert _escape("50% of\nlines") == "50%25 of%0Alines"
    assert _escape("a:b,c", prop=True) == "a%3Ab%2Cc"


@pytest.mark.parametrize(
    "args", [["--format", "xml"], ["--json", "--format", "github"]], ids=" ".join
)
def test_a_wrong_format_is_a_usage_error(functions: Path, args: list[str]) -> None:
    result = run(str(functions), *args)
    assert result.exit_code == 2
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("relay: --")


@pytest.mark.parametrize(
    ("field", "line"),
    [("runtime", 1), ("events[0].pattern.table_name", 5), ("events[0].pattern.nope", 4),
     ("events[3]", 2), ("services[0].host", 1)],
)  # fmt: skip
def test_field_line_is_the_fields_line_or_its_parents(field: str, line: int) -> None:
    assert field_line(BAD, field) == line


def test_field_line_of_text_that_is_not_yaml_is_none() -> None:
    assert field_line("events: [\n", "events") is None
