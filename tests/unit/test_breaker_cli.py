"""The ``Breaker:`` line of ``relay function inspect`` and the ``breaker`` commands'
answers, rendered from what the worker's ``breaker_state`` op returns."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from relay.entrypoints.cli import app
from relay.entrypoints.cli.breaker_view import breaker_lines


@pytest.mark.parametrize(
    ("snapshot", "line"),
    [
        (None, "Breaker:         unknown (no answer from a worker)"),
        ({"state": "closed", "enabled": False}, "Breaker:         off"),
        ({"state": "closed", "enabled": True}, "Breaker:         closed"),
        (
            {"state": "closed", "enabled": True, "failures": 2},
            "Breaker:         closed (2 consecutive failures)",
        ),
        (
            {"state": "open", "enabled": True, "cooldown_s": 60.0, "probe_in_s": 12.4},
            "Breaker:         open (probe in 12s, cooldown 1m; invocations held)",
        ),
        (
            {"state": "open", "enabled": False, "forced": True, "cooldown_s": 30.0},
            "Breaker:         open (forced: held until `relay function breaker close pay`)",
        ),
        (
            {"state": "half_open", "enabled": True, "cooldown_s": 30.0},
            "Breaker:         half-open (one probe running, every other invocation held)",
        ),
    ],
)
def test_the_inspect_line(snapshot: dict[str, object] | None, line: str) -> None:
    assert breaker_lines(snapshot, "pay") == [line]


def test_without_a_worker_the_command_fails_with_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["function", "breaker", "open", "pay"], env={"RELAY_RUN_DIR": str(tmp_path)}
    )
    assert result.exit_code == 1
    assert result.output.startswith("relay: no relay worker is running")
    assert "`relay function breaker` needs a running worker" in result.output
    assert "Traceback" not in result.output
