"""``relay`` starts without importing what the command it runs does not need.

Nothing here is timed: each command runs in a fresh interpreter that writes the
modules it imported, and a heavy one that should not be there fails the test by
name. A regression (a module-level ``import redis`` in a command module, a group
that loads its subcommands eagerly) fails here, whatever the machine's load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import pytest
import typer.main
from typer._click.exceptions import UsageError
from typer._click.utils import make_default_short_help
from typer.core import TyperGroup

from relay.entrypoints import cli
from relay.entrypoints.cli import (
    fn_authoring,
    fn_breaker,
    fn_catalog,
    fn_invoke,
    fn_run,
    function,
    publish,
    system,
    trace,
)
from relay.entrypoints.cli.lazy import Lazy
from relay.entrypoints.cli.plain_values import use_plain_values

# Never needed to list commands, print the version or publish to the embedded
# broker: the Redis and Docker clients, HTTP, rich, metrics, file watching, SSH, and
# pydantic (typer coerces any value that is not a plain str/int/bool through it: ~60 ms).
HEAVY = ("redis", "aiodocker", "aiohttp", "rich", "docker", "prometheus_client",
         "watchfiles", "asyncssh", "pydantic")  # fmt: skip
# ... nor, to print the version or the help, SQLite or the broker.
STORAGE = ("sqlite3", "relay.adapters.sqlite")

# Runs `relay ARGS...` as the console script does, then writes sys.modules.
_RUN = """
import atexit, json, os, sys
def _write():
    with open(os.environ["MODULES_OUT"], "w") as f:
        json.dump(sorted(k for k, v in list(sys.modules.items()) if v is not None), f)
atexit.register(_write)
sys.argv = ["relay", *sys.argv[1:]]
from relay.entrypoints.cli import main
main()
"""


def _imported(
    tmp_path: Path, args: list[str], env: Mapping[str, str] | None = None, stdin: str = ""
) -> set[str]:
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", _RUN, *args], input=stdin, capture_output=True, text=True,
        env={**os.environ, **(env or {}), "MODULES_OUT": str(out)}, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"relay {' '.join(args)}: {done.stderr}"
    return set(json.loads(out.read_text()))


def _offending(modules: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(
        name for name in modules if any(name == b or name.startswith(b + ".") for b in banned)
    )


def _assert_none(modules: set[str], banned: tuple[str, ...], what: str) -> None:
    found = _offending(modules, banned)
    roots = sorted({name.split(".")[0] if not name.startswith("relay.") else name
                    for name in found})  # fmt: skip
    assert not found, f"`{what}` imported {', '.join(roots)} (it needs none of them)"


@pytest.mark.parametrize("args", [["--version"], ["--help"]], ids=["version", "help"])
def test_version_and_help_import_no_client_and_no_storage(
    tmp_path: Path, args: list[str]
) -> None:
    modules = _imported(tmp_path, args)
    _assert_none(modules, HEAVY + STORAGE, f"relay {args[0]}")
    # the command modules themselves stay unloaded: the table lists them
    assert not {"relay.entrypoints.cli.dlq", "relay.entrypoints.cli.publish"} & modules


def test_publish_to_the_embedded_broker_imports_no_client(tmp_path: Path) -> None:
    broker = tmp_path / "broker.db"
    env = {"RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(broker),
           "REDIS_STREAM": "startup", "REDIS_URI": "redis://127.0.0.1:1"}  # fmt: skip
    modules = _imported(tmp_path, ["publish"], env, stdin='{"n": 1}\n{"n": 2}\n')
    # nor the schedules' rules (croniter, dateutil, the template model): a publish
    # prunes expired idempotency keys without them
    _assert_none(modules, (*HEAVY, "croniter", "dateutil", "relay.domain.template"),
                 "relay publish (embedded)")
    assert "relay.adapters.sqlite.broker.producer" in modules  # it did publish there
    assert broker.exists()


@pytest.mark.parametrize(
    "args",
    [[g, "--help"] for g in ("function", "dlq", "stats", "schedule", "secret", "git")]
    + [["trace", "--help"], ["start", "--help"], ["function", "ls", "--json"],
       ["function", "run", "--help"], ["function", "ls", "--functions", "{functions}"],
       ["function", "validate", "{functions}"]],
    ids=" ".join,
)
def test_group_help_and_function_ls_import_no_client(tmp_path: Path, args: list[str]) -> None:
    env = {"RELAY_STATE_DIR": str(tmp_path / "state"), "RELAY_RUN_DIR": str(tmp_path / "run")}
    functions = tmp_path / "functions" / "demo"  # validate: offline, so no client either
    functions.mkdir(parents=True)
    (functions / "template.yaml").write_text(
        "runtime: python3.14\nevents:\n  - handler: main.handler\n    pattern: {a: [1]}\n"
    )
    (functions / "main.py").write_text("def handler(event):\n    return None\n")
    args = [a.format(functions=functions.parent) for a in args]
    modules = _imported(tmp_path, args, env)
    # validate takes a list of paths, which typer coerces through pydantic (plain
    # values cover single str/int/bool values only)
    banned = tuple(m for m in HEAVY if m != "pydantic") if "validate" in args else HEAVY
    _assert_none(modules, banned, f"relay {' '.join(args)}")


def test_completing_a_command_name_loads_no_command(tmp_path: Path) -> None:
    env = {"_RELAY_COMPLETE": "complete_bash", "COMP_WORDS": "relay d", "COMP_CWORD": "1"}
    modules = _imported(tmp_path, [], env)
    loaded = sorted(m for m in modules if m.startswith("relay.entrypoints.cli."))
    assert set(loaded) <= {f"relay.entrypoints.cli.{m}" for m in
                           ("common", "help_format", "lazy", "plain_values")}, loaded  # fmt: skip


def _tables() -> list[tuple[str, str, Lazy, TyperGroup]]:
    root = typer.main.get_command(cli.app)
    assert isinstance(root, TyperGroup)
    fn_group = root.commands["function"]
    assert isinstance(fn_group, TyperGroup)
    return [(f"{prefix}{name}", name, entry, group)
            for prefix, table, group in (("", cli.COMMANDS, root),
                                         ("function ", function.COMMANDS, fn_group))
            for name, entry in table.items()]  # fmt: skip


@pytest.mark.parametrize(("path", "name", "entry", "group"), _tables(), ids=str)
def test_each_lazy_entry_shows_the_commands_own_help(
    path: str, name: str, entry: Lazy, group: TyperGroup
) -> None:
    command = group.commands[name]  # loads it
    assert command.name == name, path
    for limit in (45, 300):
        assert make_default_short_help(entry.help, limit) == command.get_short_help_str(limit), (
            f"relay {path}: the table's help differs from the command's own"
        )


def test_every_command_of_a_lazy_group_is_in_its_table() -> None:
    # a command registered in a module but missing from the table would vanish
    probe = typer.Typer()
    for module in (system, trace, publish):
        module.register(probe)
    names = set(typer.main.get_group(probe).commands)
    assert names == {"start", "health", "trace", "publish"}
    assert names <= set(cli.COMMANDS)
    probe = typer.Typer()
    for module in (fn_catalog, fn_invoke, fn_run, fn_authoring, fn_breaker):
        module.register(probe)
    assert set(typer.main.get_group(probe).commands) == set(function.COMMANDS)


# --- plain values: the same answer as typer's own (pydantic) coercion -------------

_VALUES = ["5", "0", "-3", "007", "+2", "1_000", " 5", "x", "", "5.0", "9" * 25, "-0",
           "é", "\udcff"]  # fmt: skip


def _probe_command(plain: bool) -> Any:
    probe = typer.Typer()

    @probe.command()
    def run(
        number: Annotated[int, typer.Option("--number")] = 1,
        text: Annotated[str | None, typer.Option("--text")] = None,
    ) -> None:
        typer.echo(f"{number!r} {text!r}")

    command = typer.main.get_command(probe)
    if plain:
        for param in command.params:
            use_plain_values(param)
    return command


def _parse(command: Any, args: list[str]) -> tuple[str, Any]:
    try:
        return "ok", command.make_context("run", args).params
    except UsageError as exc:
        return "error", exc.format_message()


@pytest.mark.parametrize("value", _VALUES, ids=repr)
@pytest.mark.parametrize("option", ["--number", "--text"])
def test_plain_values_answer_as_typer_does(option: str, value: str) -> None:
    typer_own, plain = (_parse(_probe_command(p), [option, value]) for p in (False, True))
    assert plain == typer_own
    if plain[0] == "ok" and option == "--number":
        assert type(plain[1]["number"]) is int


def test_help_lists_commands_in_the_tables_order_whatever_was_loaded_first() -> None:
    root = typer.main.get_command(cli.app)
    assert isinstance(root, TyperGroup)
    _ = root.commands["git"], root.commands["trace"]  # loaded out of order
    ctx = root.make_context("relay", ["--help"], resilient_parsing=True)
    assert root.list_commands(ctx) == list(cli.COMMANDS)
