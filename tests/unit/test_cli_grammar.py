"""One CLI grammar: every wrong command line, in every command, is one ``relay:``
line and exit 2; and ``docs/cli.md``'s exit-code tables say what the app does.

The walk: the app's tree is built as ``relay`` builds it (``typer.main.get_command``)
and every group's commands are resolved by name, which loads each lazy command
(``cli/lazy.py``), so a command added to a table is walked without touching this
file. Each command (group or leaf) is then run with an option no command has:
click refuses it while parsing, before the command's body runs, so no broker,
Docker or state directory is needed, and the answer must be exactly one line,
exit 2. Leaf commands with a required argument are also run without it. The same
tree is compared with the command column of ``docs/cli.md``: each documented
command exists and each leaf command is documented.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperArgument, TyperGroup
from typer.testing import CliRunner

from relay.entrypoints.cli import app

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
BOGUS = "--no-such-option-anywhere"


def _tree(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, command)]
    if isinstance(command, TyperGroup):
        for name in command.list_commands(None):  # type: ignore[arg-type]  # unused by groups
            found += _tree(command.commands[name], (*path, name))
    return found


TREE = _tree(typer.main.get_command(app))
IDS = [" ".join(p) or "relay" for p, _ in TREE]
LEAVES = [(p, c) for p, c in TREE if not isinstance(c, TyperGroup)]


def run(*args: str) -> Any:
    # no broker, no state: a usage error must be found before either is needed
    return CliRunner().invoke(app, list(args), env={"RELAY_STATE_DIR": "/nonexistent"})


def assert_one_usage_line(result: Any) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("relay: "), lines[0]
    assert "Traceback" not in result.output
    return str(lines[0])


@pytest.mark.parametrize(("path", "command"), TREE, ids=IDS)
def test_an_unknown_option_is_one_line_and_exit_2(path: tuple[str, ...], command: Any) -> None:
    line = assert_one_usage_line(run(*path, BOGUS))
    assert f"no such option: {BOGUS}" in line
    assert f"(see '{' '.join(('relay', *path))} --help')" in line


@pytest.mark.parametrize(
    ("path", "command"),
    [(p, c) for p, c in LEAVES if any(
        isinstance(param, TyperArgument) and param.required for param in c.params)],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else "",
)
def test_a_missing_argument_is_one_line_and_exit_2(path: tuple[str, ...], command: Any) -> None:
    assert "missing argument" in assert_one_usage_line(run(*path))


@pytest.mark.parametrize(
    "args",
    [
        # the cases of issue 32: some exited 1, some printed click's usage block
        ["publish", "--count", "0", "--event", "{}"],
        ["publish", "--count", "many", "--event", "{}"],
        ["publish", "--priority", "urgent", "--event", "{}"],
        ["function", "match", ".", "--event", "{}", "--file", "e.json"],
        ["function", "invoke", "f", "--event", "{}", "--file", "e.json"],
        ["function", "match", ".", "--event", "{}", "--at", "yesterday"],
        ["dlq", "ls", "--since", "1x"],
        ["dlq", "replay", "--function", "f", "--rate", "fast"],
        ["dlq", "ls", "--json=yes"],
        ["no-such-command"],
    ],
    ids=" ".join,
)
def test_the_issues_cases_exit_2_with_one_line(args: list[str]) -> None:
    """Row 276."""
    assert_one_usage_line(run(*args))


def test_a_bare_group_still_prints_its_help() -> None:
    # `relay dlq` alone asks what there is: the help, not an error line
    result = run("dlq")
    assert "Commands" in result.output
    assert result.exit_code == 2


# --- docs/cli.md ------------------------------------------------------------------
def _documented() -> tuple[set[str], dict[str, set[str]]]:
    """Command paths of the Commands table, and each row's exit codes."""
    commands: set[str] = set()
    codes: dict[str, set[str]] = {}
    for row in DOCS.read_text().splitlines():
        cells = [cell.strip() for cell in row.split(" | ")]
        if not row.startswith("| `relay ") or len(cells) < 3:
            continue
        usage_text = cells[0].removeprefix("| `").split("`")[0]
        words: list[str] = []
        for word in usage_text.split()[1:]:
            if not re.fullmatch(r"[a-z][a-z|\\-]*", word):
                break  # an argument (NAME), an option (--x) or a [selection]
            words.append(word)
        # `function breaker open\|close NAME`: one row, two commands
        for path in _expand(words):
            commands.add(path)
            codes.setdefault(path, set()).update(re.findall(r"\d+", cells[2]))
    return commands, codes


def _expand(words: list[str]) -> list[str]:
    paths = [""]
    for word in words:
        paths = [f"{p} {alt}".strip() for p in paths for alt in word.replace("\\", "").split("|")]
    return paths


def test_docs_cli_lists_exactly_the_apps_commands() -> None:
    documented, _ = _documented()
    leaves = {" ".join(p) for p, _ in LEAVES}
    # `relay --version` (the root) and `relay stats` are groups that run alone too
    groups_run_alone = {" ".join(p) for p, c in TREE if isinstance(c, TyperGroup)}
    assert documented - leaves - groups_run_alone == set(), "documented but not in the app"
    assert leaves - documented == set(), "in the app but not in docs/cli.md"


def test_docs_cli_exit_codes_are_the_tables() -> None:
    _, codes = _documented()
    top = set(re.findall(r"^\| `(\d+)` \|", DOCS.read_text(), re.MULTILINE))
    assert top == {"0", "1", "2", "130"}
    for path, row in codes.items():
        assert row <= top, path
