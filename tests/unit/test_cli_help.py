"""``relay ... --help`` for every command of the tree: no Python type names, boolean
options are plain flags, and shell completion is on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperGroup
from typer.testing import CliRunner

from relay.entrypoints.cli import app

RELAY = str(Path(sys.executable).with_name("relay"))

# typer's rendering of an annotation (<bool>, <str>, <int>, <path>, <list[str]>,
# <int range>, ...) and click's type names (TEXT, INTEGER, ...): an operator reads
# neither. A placeholder of a command's own help text (<duration>) is not one.
_TYPE_NAME = re.compile(
    r"<(?:bool|str|int|float|bytes|path|file|dir|directory|datetime|uuid|NoneType"
    r"|list\[[^>]*\]|[a-z]+ range)>"
    r"|\b(?:TEXT|INTEGER|FLOAT|BOOLEAN|FILENAME|UUID|NoneType)\b"
)


def _tree(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, command)]
    if isinstance(command, TyperGroup):
        for name, sub in sorted(command.commands.items()):
            found += _tree(sub, (*path, name))
    return found


TREE = _tree(typer.main.get_command(app))


def test_the_tree_holds_every_command() -> None:
    paths = {" ".join(path) for path, _ in TREE}
    for expected in ("", "start", "health", "trace", "function inspect", "stats reset",
                     "dlq ls", "schedule ls", "secret set", "git status"):  # fmt: skip
        assert expected in paths
    flags = {
        opt
        for _, command in TREE
        for param in command.params
        if param.param_type_name == "option" and param.type_descriptor.annotation is bool
        for opt in param.opts
    }
    assert {"--json", "--embedded", "--force", "--allow-empty", "--oldest-first"} <= flags


@pytest.mark.parametrize(("path", "command"), TREE, ids=[" ".join(p) or "relay" for p, _ in TREE])
def test_help_names_no_python_type(path: tuple[str, ...], command: Any) -> None:
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    found = _TYPE_NAME.search(result.stdout)
    where = f"relay {' '.join(path)} --help"
    assert found is None, f"{where} shows {found.group(0)!r}:\n{result.stdout}"


@pytest.mark.parametrize(("path", "command"), TREE, ids=[" ".join(p) or "relay" for p, _ in TREE])
def test_boolean_options_are_flags(path: tuple[str, ...], command: Any) -> None:
    for param in command.params:
        if param.param_type_name == "option" and param.type_descriptor.annotation is bool:
            assert param.is_flag, f"relay {' '.join(path)} {param.opts[0]} takes a value"
            assert not param.secondary_opts, (
                f"relay {' '.join(path)} {param.opts[0]} has a --no- twin"
            )


def test_completion_is_on_and_completes_commands_and_options() -> None:
    root = CliRunner().invoke(app, ["--help"])
    assert "--install-completion" in root.stdout
    assert "--show-completion" in root.stdout
    # typer detects the shell from the process tree: run it from bash
    script = subprocess.run(
        ["bash", "-c", f"{RELAY} --show-completion"], capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert script.returncode == 0, script.stderr
    assert "complete -o default -F _relay_completion relay" in script.stdout

    def complete(words: str) -> list[str]:
        env = {**os.environ, "_RELAY_COMPLETE": "complete_bash", "COMP_WORDS": words,
               "COMP_CWORD": str(len(words.split()) - 1)}  # fmt: skip
        done = subprocess.run(
            [RELAY], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("relay fun") == ["function"]
    assert complete("relay function ins") == ["inspect"]
    assert "--json" in complete("relay trace --")
