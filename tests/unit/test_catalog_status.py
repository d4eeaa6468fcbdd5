"""What ``relay function ls`` says about a function nothing serves: the reconciler on
fakes publishes into the real state view, and the CLI reads the real database file."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from relay.adapters.sqlite.state_view import SqliteStateView
from relay.domain.commands import ReconcileAll
from relay.entrypoints.cli import app
from tests.unit.test_reconcile import World

pytestmark = pytest.mark.anyio

INVALID = "runtime: python3.14\nevents:\n  - handler: main\n    pattern: {x: [1]}\n"


async def test_a_function_that_does_not_serve_is_failed_and_inspect_says_why(
    tmp_path: Path,
) -> None:
    functions, state = tmp_path / "functions", tmp_path / "state"
    world = World(functions)
    view = SqliteStateView(state / "db.sqlite3")
    view.subscribe(world.bus)
    await view.open()
    world.write("broken", template=INVALID)
    world.write("no-image")
    world.builder.failures["no-image"] = "no such base image"
    world.write("good")
    await world.send(ReconcileAll())
    await view.aclose()
    env = {"RELAY_STATE_DIR": str(state), "RELAY_RUN_DIR": str(tmp_path / "run")}

    listed = CliRunner().invoke(app, ["function", "ls"], env=env)

    statuses = {line.split()[0]: line.split()[2] for line in listed.stdout.splitlines()[1:]}
    assert statuses == {"broken": "failed", "good": "ready", "no-image": "failed"}
    shown = CliRunner().invoke(app, ["function", "inspect", "broken"], env=env)
    lines = shown.stdout.splitlines()
    assert "Status:          failed" in lines
    assert any(line.startswith("Last reconcile:  failed (") for line in lines)
    [error] = [line for line in lines if line.startswith("Last error:")]
    assert 'invalid template: events[0].handler: "main" must be module.function' in error
    assert not any(line.startswith(("Image:", "Prepared:")) for line in lines)
