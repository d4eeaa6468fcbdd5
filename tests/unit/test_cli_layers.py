"""The import-linter contract "CLI helpers never import CLI commands" names every
module of the CLI once: a command module (it registers commands, or is a sub-app) or a helper.

A new CLI module left out of both lists would escape the contract; a helper that
grew a ``register`` would be a command the contract lets helpers import.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import relay.entrypoints.cli

CLI = Path(relay.entrypoints.cli.__file__).parent
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
PREFIX = "relay.entrypoints.cli."


def contract() -> dict[str, Any]:
    contracts = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"][
        "contracts"
    ]
    (found,) = [c for c in contracts if c["name"] == "CLI helpers never import CLI commands"]
    return dict(found)


def test_every_cli_module_is_a_command_or_a_helper() -> None:
    found = contract()
    helpers = {m.removeprefix(PREFIX) for m in found["source_modules"]}
    commands = {m.removeprefix(PREFIX) for m in found["forbidden_modules"]}
    modules = {p.stem for p in CLI.glob("*.py")} - {"__init__"}
    assert helpers & commands == set()
    assert helpers | commands == modules
    for name in sorted(modules):
        text = (CLI / f"{name}.py").read_text(encoding="utf-8")
        # a command module registers commands on the app, or is a typer sub-app
        registers = "\ndef register(" in text or "\napp = typer.Typer(" in text
        assert registers == (name in commands), name
