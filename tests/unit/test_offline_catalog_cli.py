"""``relay function ls --functions DIR`` and ``relay schedule ls --functions DIR``:
a directory's functions and schedules with no worker, no state database, no broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from relay.entrypoints.cli import app
from tests.json_schemas import assert_matches_schema

NIGHTLY = """\
runtime: python3.14
schedules:
  - handler: jobs.nightly
    cron: "0 3 * * *"
    timezone: Europe/Rome
  - handler: jobs.often
    cron: "*/5 * * * *"
"""
EVENTS = """\
runtime: node24
events:
  - handler: main.handler
    pattern: {a: [1]}
"""
BROKEN = "runtime: cobol\nevents: []\n"


@pytest.fixture
def functions(tmp_path: Path) -> Path:
    root = tmp_path / "functions"
    for name, template, files in (
        ("nightly", NIGHTLY, {"jobs.py": "def nightly(e):\n    pass\ndef often(e):\n    pass\n"}),
        ("greeter", EVENTS, {"main.mjs": "export function handler() {}\n"}),
        ("broken", BROKEN, {}),
    ):
        (root / name).mkdir(parents=True)
        (root / name / "template.yaml").write_text(template)
        for file, text in files.items():
            (root / name / file).write_text(text)
    return root


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # a state directory that does not exist and no broker configured: none is read
    return {"RELAY_STATE_DIR": str(tmp_path / "no-state"), "RELAY_RUN_DIR": str(tmp_path / "run"),
            "REDIS_URL": "", "RELAY_BROKER": ""}


def test_function_ls_lists_the_directory_with_validity(
    functions: Path, env: dict[str, str]
) -> None:
    result = CliRunner().invoke(app, ["function", "ls", "--functions", str(functions)], env=env)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "RUNTIME", "STATUS", "UPDATED"]
    assert [line.split() for line in lines[1:]] == [
        ["broken", "-", "invalid", "-"],
        ["greeter", "node24", "valid", "-"],
        ["nightly", "python3.14", "valid", "-"],
    ]
    assert result.stderr == (
        f"relay: 1 invalid function in {functions}; "
        f"`relay function validate {functions}` says why\n"
    )
    doc = assert_matches_schema(
        CliRunner().invoke(
            app, ["function", "ls", "--functions", str(functions), "--json"], env=env
        ).stdout
    )
    assert [(f["name"], f["status"], f["updated_at"]) for f in doc["functions"]] == [
        ("broken", "invalid", None), ("greeter", "valid", None), ("nightly", "valid", None)
    ]


def test_schedule_ls_lists_next_occurrences_without_a_broker(
    functions: Path, env: dict[str, str]
) -> None:
    result = CliRunner().invoke(app, ["schedule", "ls", "--functions", str(functions)], env=env)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["SCHEDULE", "CRON", "TIMEZONE", "LAST"]
    assert lines[1].startswith("nightly/jobs.nightly  0 3 * * *")
    assert "Europe/Rome" in lines[1]
    assert "unknown" in lines[1]  # the broker is not read
    assert lines[2].startswith("nightly/jobs.often")
    doc = assert_matches_schema(
        CliRunner().invoke(
            app, ["schedule", "ls", "--functions", str(functions), "--json"], env=env
        ).stdout
    )
    assert [s["handler"] for s in doc["schedules"]] == ["jobs.nightly", "jobs.often"]
    nightly = doc["schedules"][0]
    assert nightly["last_published"] is None
    assert nightly["next_at"].endswith(("T01:00:00Z", "T02:00:00Z"))  # 03:00 in Rome
    assert doc["last_published_error"].startswith("not read")


def test_one_function_directory_and_a_missing_one(functions: Path, env: dict[str, str]) -> None:
    one = CliRunner().invoke(app, ["schedule", "ls", "--functions", str(functions / "nightly")],
                             env=env)
    assert one.exit_code == 0, one.output
    assert len(one.stdout.splitlines()) == 3
    none = CliRunner().invoke(app, ["schedule", "ls", "--functions", str(functions / "greeter")],
                              env=env)
    assert none.stdout == "no schedules\n"
    missing = CliRunner().invoke(app, ["function", "ls", "--functions", str(functions / "x")],
                                 env=env)
    assert missing.exit_code == 1
    assert missing.stderr == f"relay: {functions / 'x'}: no such file or directory\n"
