"""``relay function run``'s refusals, each one line before any container starts
(the runs themselves: ``e2e/test_function_run_e2e.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from relay.entrypoints.cli import app

TEMPLATE = "runtime: python3.14\nevents:\n  - handler: main.handler\n    pattern: {a: [1]}\n"


@pytest.fixture
def function(tmp_path: Path) -> Path:
    directory = tmp_path / "functions" / "demo"
    directory.mkdir(parents=True)
    (directory / "template.yaml").write_text(TEMPLATE)
    (directory / "main.py").write_text("def handler(event):\n    return 1\n")
    return directory


def run(tmp_path: Path, *args: str, **env: str) -> Result:
    values = {"RELAY_STATE_DIR": str(tmp_path / "state"), **env}
    return CliRunner().invoke(app, ["function", "run", *args], env=values)


def test_an_unreachable_engine_is_one_line(tmp_path: Path, function: Path) -> None:
    result = run(tmp_path, str(function), "main.handler", "--event", '{"a": 1}',
                 DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("relay: docker is unreachable")
    assert len(result.stderr.splitlines()) == 1


def test_not_a_function_directory(tmp_path: Path, function: Path) -> None:
    result = run(tmp_path, str(function.parent), "main.handler", "--event", "{}")
    assert result.exit_code == 1
    assert result.stderr == (
        f"relay: {function.parent}: not a function directory (no template.yaml in it)\n"
    )
    missing = run(tmp_path, str(tmp_path / "nope"), "main.handler", "--event", "{}")
    assert missing.stderr == f"relay: {tmp_path / 'nope'}: no such directory\n"


def test_an_invalid_template_says_its_problems(tmp_path: Path, function: Path) -> None:
    (function / "template.yaml").write_text("runtime: cobol\n")
    result = run(tmp_path, str(function), "main.handler", "--event", "{}")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"relay: {function}: invalid function: ")
    assert len(result.stderr.splitlines()) == 1


def test_a_services_only_function_has_no_handler_to_run(tmp_path: Path, function: Path) -> None:
    (function / "template.yaml").write_text("services:\n  - build: Dockerfile\n    port: 8080\n")
    (function / "Dockerfile").write_text("FROM scratch\n")
    result = run(tmp_path, str(function), "main.handler", "--event", "{}")
    assert result.exit_code == 1
    assert result.stderr == 'relay: function "demo" has no runtime: it has no handler to run\n'


def test_the_event_and_file_dash_are_exclusive(tmp_path: Path, function: Path) -> None:
    result = run(tmp_path, str(function), "main.handler", "--event", "{}", "--file", "-")
    assert result.exit_code == 2
    assert "mutually exclusive" in result.stderr
