"""``relay function validate`` and ``relay function match`` run as a user runs them."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relay.entrypoints.cli import app

pytestmark = pytest.mark.e2e

RELAY = str(Path(sys.executable).parent / "relay")

USER_EVENTS = """\
runtime: python3.14
events:
  - handler: events.created.handler
    pattern:
      event_name: [INSERT]
      table_name: [users]
  - handler: events.recent.handler
    pattern:
      new_image:
        created_at:
          gt: "now()-5m"
"""
BROKEN = """\
runtime: python3.12
events:
  - handler: handler
    pattern: {x: 1}
    timeout: 10m
"""


def run(
    *args: str, stdin: str | None = None, real: bool = False
) -> subprocess.CompletedProcess[str]:
    """``relay ARGS``: the installed command in a process of its own when ``real``, else
    the same typer app in this process through typer's runner (an interpreter start per
    command made this file take minutes). Without ``stdin`` both read an empty,
    non-interactive stdin, as ``< /dev/null`` gives."""
    if real:
        return subprocess.run(
            [RELAY, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL if stdin is None else None,
        )
    result = CliRunner().invoke(app, list(args), input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        [RELAY, *args], result.exit_code, result.stdout, result.stderr
    )


def function(root: Path, name: str, template: str) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "template.yaml").write_text(template)
    return directory


@pytest.fixture
def functions(tmp_path: Path) -> Path:
    root = tmp_path / "functions"
    user_events = function(root, "user-events", USER_EVENTS)
    (user_events / "events").mkdir()
    for module in ("created", "recent"):
        (user_events / "events" / f"{module}.py").write_text("def handler(event):\n    pass\n")
    (root / "not-a-function").mkdir()  # no template.yaml: ignored
    return root


def test_validate_a_valid_function_directory(functions: Path) -> None:
    result = run("function", "validate", str(functions / "user-events"), real=True)
    assert (result.returncode, result.stdout, result.stderr) == (0, "ok user-events\n", "")


def test_validate_a_functions_directory_reports_every_error(functions: Path) -> None:
    function(functions, "broken", BROKEN)
    function(functions, "Bad Name", "runtime: node24\n")
    result = run("function", "validate", str(functions))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        'Bad Name: invalid function name "Bad Name": must start with a lowercase letter or '
        "digit and contain only lowercase letters, digits, '.', '_' and '-'",
        'broken: runtime: "python3.12" is not supported (use python3.14 or node24)',
        'broken: events[0].handler: "handler" must be module.function, e.g. events.created.handler',
        "broken: events[0].pattern.x: must be a list of values, a map of operators or a map of "
        "nested fields (got 1; write [1] for equality)",
        'broken: events[0].timeout: must be at most 5m (got "10m")',
        "ok user-events",
    ]
    assert "Traceback" not in result.stderr


def test_validate_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    directory = function(tmp_path, "fn", "runtime: node24\nevents: [\n")
    result = run("function", "validate", str(directory))
    assert result.returncode == 1
    (line,) = result.stdout.splitlines()
    assert line.startswith(f"fn: {directory / 'template.yaml'}:")
    assert "invalid YAML" in line


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("concurrency: 2024-02-30", '"2024-02-30" is not a valid date or time'),
        ("concurrency: 2024-01-01 25:61:61", '"2024-01-01 25:61:61" is not a valid date'),
        (f"concurrency: {'7' * 4301}", "has 4301 digits, more than the 4300 allowed"),
        ("runtime: node24", 'duplicate key "runtime" (first at line 1)'),
    ],
)
def test_validate_shows_a_template_the_yaml_loader_cannot_read_as_one_line(
    functions: Path, line: str, expected: str
) -> None:
    directory = function(functions, "odd", f"runtime: node24\n{line}\nevents: []\n")
    result = run("function", "validate", str(functions))
    assert result.returncode == 1
    assert result.stderr == ""
    odd, ok = result.stdout.splitlines()
    assert odd.startswith(f"odd: {directory / 'template.yaml'}:2: invalid YAML: ")
    assert expected in odd
    assert ok == "ok user-events"  # the other function is still validated


def test_validate_missing_path_fails(functions: Path, tmp_path: Path) -> None:
    result = run("function", "validate", str(functions), str(tmp_path / "nope"))
    assert result.returncode == 1
    assert result.stdout == "ok user-events\n"
    assert result.stderr == f"relay: {tmp_path / 'nope'}: no such file or directory\n"


def test_validate_a_directory_without_functions_fails(tmp_path: Path) -> None:
    result = run("function", "validate", str(tmp_path))
    assert result.returncode == 1
    assert "no functions found" in result.stderr


def test_match_explains_each_rule(functions: Path) -> None:
    event = {"event_name": "INSERT", "table_name": "orders", "new_image": {"created_at": 5}}
    result = run("function", "match", str(functions), "--event", json.dumps(event))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        'no     user-events  events.created.handler: pattern.table_name: "orders" is not one '
        'of ["users"]',
        "no     user-events  events.recent.handler: pattern.new_image.created_at.gt: value is "
        "not an RFC3339 string (got 5)",
        "0 of 2 event rules matched",
    ]


def test_match_from_a_file_and_from_stdin(functions: Path, tmp_path: Path) -> None:
    event = json.dumps({"event_name": "INSERT", "table_name": "users"})
    path = tmp_path / "event.json"
    path.write_text(event)
    by_file = run("function", "match", str(functions / "user-events"), "--file", str(path))
    by_stdin = run("function", "match", str(functions / "user-events"), stdin=event, real=True)
    assert by_file.returncode == by_stdin.returncode == 0
    assert by_file.stdout == by_stdin.stdout
    lines = by_file.stdout.splitlines()
    assert lines[0] == "match  user-events  events.created.handler"
    assert lines[1].startswith("no     user-events  events.recent.handler: pattern.new_image")
    assert lines[2] == "1 of 2 event rules matched"


def test_match_lists_invalid_functions_as_skipped(functions: Path) -> None:
    function(functions, "broken", BROKEN)
    result = run("function", "match", str(functions), "--event", "{}")
    assert result.returncode == 0
    assert result.stdout.splitlines()[0] == (
        "skip   broken       invalid template (run: relay function validate)"
    )


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("[1, 2]", "relay: --event: event must be a JSON object, not an array\n"),
        ("null", "relay: --event: event must be a JSON object, not null\n"),
        ('"x"', "relay: --event: event must be a JSON object, not a string\n"),
        ("{", "relay: --event: event is not valid JSON: Expecting property name enclosed in "
         "double quotes (line 1, column 2)\n"),
    ],
)  # fmt: skip
def test_match_rejects_non_object_events(functions: Path, payload: str, message: str) -> None:
    result = run("function", "match", str(functions), "--event", payload)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", message)


def test_match_event_and_file_are_exclusive(functions: Path, tmp_path: Path) -> None:
    result = run("function", "match", str(functions), "--event", "{}", "--file", str(tmp_path))
    assert result.returncode == 2  # a wrong command line (row 276)
    assert result.stderr == (
        "relay: --event and --file are mutually exclusive; give one"
        " (see 'relay function match --help')\n"
    )


def test_match_with_an_interactive_terminal_fails_fast(functions: Path) -> None:
    controller, terminal = pty.openpty()
    try:
        result = subprocess.run(
            [RELAY, "function", "match", str(functions)],
            stdin=terminal,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(terminal)
        os.close(controller)
    assert result.returncode == 1
    assert result.stderr.startswith("relay: no event given")


def test_match_missing_path_fails(tmp_path: Path) -> None:
    result = run("function", "match", str(tmp_path / "nope"), "--event", "{}")
    assert result.returncode == 1
    assert result.stderr == f"relay: {tmp_path / 'nope'}: no such file or directory\n"


@pytest.mark.parametrize("name", ["abc-", "a..b", "a___b"])
def test_validate_flags_names_docker_cannot_build(tmp_path: Path, name: str) -> None:
    function(tmp_path, name, "runtime: node24\n")
    result = run("function", "validate", str(tmp_path))
    assert result.returncode == 1
    assert result.stdout.startswith(f'{name}: invalid function name "{name}": must end with')
    assert "Docker image" in result.stdout


def test_validate_checks_what_the_build_would_refuse(tmp_path: Path) -> None:
    node = function(
        tmp_path,
        "welcome",
        "runtime: node24\nevents:\n  - handler: handler.main\n    pattern: {a: [1]}\n"
        "services:\n  - build: Dockerfile\n",
    )
    result = run("function", "validate", str(node))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "welcome: handler module 'handler' not found (looked for handler.mjs"
    )
    assert lines[1] == (
        'welcome: services[0].build: "Dockerfile" is not a source file of the function '
        "(missing, or excluded by .gitignore)"
    )
    (node / "handler.js").write_text("export function main() {}\n")
    (node / "Dockerfile").write_text("FROM scratch\n")
    assert run("function", "validate", str(node)).stdout == "ok welcome\n"
    (node / ".gitignore").write_text("Dockerfile\n")
    assert "excluded by .gitignore" in run("function", "validate", str(node)).stdout


@pytest.mark.parametrize(
    ("runtime", "looked_for"),
    [("python3.14", "handler.py, handler/__init__.py"), ("node24", "handler.mjs, handler.js")],
)
def test_validate_checks_the_handler_module_of_both_runtimes(
    tmp_path: Path, runtime: str, looked_for: str
) -> None:
    template = f"runtime: {runtime}\nevents:\n  - handler: handler.main\n    pattern: {{a: [1]}}\n"
    directory = function(tmp_path, "fn", template)
    result = run("function", "validate", str(directory))
    assert result.returncode == 1
    [line] = result.stdout.splitlines()
    assert line.startswith(f"fn: handler module 'handler' not found (looked for {looked_for}")
    if runtime == "python3.14":
        (directory / "handler.py").write_text("def main(event):\n    pass\n")
    else:
        (directory / "handler.js").write_text("export function main() {}\n")
    assert run("function", "validate", str(directory)).stdout == "ok fn\n"


def test_match_at_a_given_instant(functions: Path) -> None:
    event = json.dumps({"new_image": {"created_at": "2026-09-12T09:58:00Z"}})
    target = str(functions / "user-events")
    inside = run("function", "match", target, "--event", event, "--at", "2026-09-12T10:00:00Z")
    assert "match  user-events  events.recent.handler" in inside.stdout.splitlines()
    later = run("function", "match", target, "--event", event, "--at", "2026-09-12T10:03:00Z")
    assert (
        "no     user-events  events.recent.handler: pattern.new_image.created_at.gt: "
        '"2026-09-12T09:58:00Z" is not after now()-5m (2026-09-12T09:58:00Z)'
    ) in later.stdout.splitlines()
    bad = run("function", "match", target, "--event", event, "--at", "yesterday")
    assert bad.returncode == 2  # a wrong command line (row 276)
    assert bad.stderr.startswith('relay: --at: "yesterday" is not an RFC3339 timestamp')


def test_match_does_not_need_buildable_source(tmp_path: Path) -> None:
    node = function(
        tmp_path,
        "welcome",
        "runtime: node24\nevents:\n  - handler: handler.main\n    pattern: {a: [1]}\n",
    )
    result = run("function", "match", str(node), "--event", '{"a": 1}')
    assert result.stdout.splitlines()[0] == "match  welcome  handler.main"


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "functions"
SPEC_EVENT = {
    "event_id": "evt_123",
    "event_name": "INSERT",
    "table_name": "users",
    "new_image": {"id": "user_123", "name": "John Doe", "email": "john@example.com"},
}


def test_the_shipped_examples_validate() -> None:
    result = run("function", "validate", str(EXAMPLES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok user-events-python" in result.stdout.splitlines()


def test_the_spec_example_event_matches_both_example_functions() -> None:
    result = run("function", "match", str(EXAMPLES), "--event", json.dumps(SPEC_EVENT), real=True)
    assert result.returncode == 0
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert "match user-events-python events.created.handler" in lines
    assert "match welcome-email-node handler.handler" in lines
    assert sum(line.startswith("match ") for line in lines) == 2
