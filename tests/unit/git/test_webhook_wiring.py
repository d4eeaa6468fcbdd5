"""When the worker wires the webhook: opt-in twice, and a corrupt source disables it."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from relay.adapters.git.webhook import git_webhook
from relay.application.bus import MessageBus
from tests.fakes import InMemorySecretStore


def wire(state: Path) -> object:
    return git_webhook(
        host="127.0.0.1", port=0, state_dir=state, secrets=InMemorySecretStore(),
        send=MessageBus({}).send, emit=lambda _e: None,
    )


def test_no_source_disables_the_webhook_and_says_why(tmp_path: Path) -> None:
    with capture_logs() as logs:
        assert wire(tmp_path) is None
    assert [(e["event"], e["reason"]) for e in logs] == [
        ("git_webhook_disabled", "no git source is configured (relay git set); nothing is bound")
    ]


def test_a_corrupt_source_disables_the_webhook_with_an_error_not_a_crash(
    tmp_path: Path,
) -> None:
    (tmp_path / "git").mkdir()
    (tmp_path / "git" / "source.json").write_text('{"repository": "git@h:a/b.git", "ref": "-x"}')
    with capture_logs() as logs:
        assert wire(tmp_path) is None
    assert len(logs) == 1
    assert logs[0]["event"] == "git_webhook_disabled"
    assert logs[0]["log_level"] == "error"
    assert "source.json is corrupt" in logs[0]["reason"]


def test_a_configured_source_wires_a_scheduler_and_a_server(tmp_path: Path) -> None:
    (tmp_path / "git").mkdir()
    (tmp_path / "git" / "source.json").write_text('{"repository": "git@h:a/b.git"}')
    wired = wire(tmp_path)
    assert isinstance(wired, tuple)
    assert len(wired) == 2
