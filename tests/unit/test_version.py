"""``relay --version``: the package version, and the commit when one is known."""

from __future__ import annotations

import tomllib
from pathlib import Path

from typer.testing import CliRunner

from relay.entrypoints.cli import app
from relay.entrypoints.version import checkout_commit, package_version, version_line

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_pyprojects() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        assert package_version() == tomllib.load(f)["project"]["version"]


def test_a_baked_in_commit_is_printed_after_the_version() -> None:
    assert version_line({"RELAY_COMMIT": "0123abcd4567"}) == (
        f"relay {package_version()} (commit 0123abcd4567)"
    )


def test_outside_a_checkout_and_without_relay_commit_only_the_version(tmp_path: Path) -> None:
    assert checkout_commit(tmp_path) == ""
    assert version_line({}, source=tmp_path) == f"relay {package_version()}"


def test_the_cli_flag_prints_one_line_and_exits_zero() -> None:
    result = CliRunner().invoke(app, ["--version"], env={"RELAY_COMMIT": "feedface"})
    assert result.exit_code == 0
    assert result.output == f"relay {package_version()} (commit feedface)\n"
