"""Shell completion of function names and DLQ ids: the table matches the app, each
source answers from real files (the state database, a functions directory, the
embedded broker file), and a source that cannot answer offers nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperGroup

from relay.adapters.sqlite.broker.ledger import insert_dead_letter
from relay.adapters.sqlite.broker.store import open_checked
from relay.adapters.sqlite.db import db_path, open_db
from relay.domain.outcome import DeadLetterEntry
from relay.entrypoints.cli import app
from relay.entrypoints.cli.completion import COMPLETIONS, dlq_ids, function_names

RELAY = str(Path(sys.executable).with_name("relay"))


def _command(path: tuple[str, ...]) -> Any:
    command: Any = typer.main.get_command(app)
    for name in path:
        assert isinstance(command, TyperGroup), path
        command = command.commands[name]
    return command


@pytest.mark.parametrize(("path", "param"), list(COMPLETIONS), ids=str)
def test_each_completion_names_a_parameter_of_the_app(path: tuple[str, ...], param: str) -> None:
    command = _command(path)
    [found] = [p for p in command.params if p.name == param]
    assert found._custom_shell_complete is not None  # attached when the command loaded


@pytest.fixture
def where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith(("REDIS_", "RELAY_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("RELAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RELAY_BROKER", "sqlite")
    monkeypatch.setenv("RELAY_BROKER_PATH", str(tmp_path / "broker.sqlite3"))
    return tmp_path


def test_function_names_come_from_the_worker_and_the_functions_directory(where: Path) -> None:
    assert function_names() == []  # nothing yet, and no file created to say so
    assert not (where / "state").exists()
    (where / "functions" / "on-disk").mkdir(parents=True)
    (where / "functions" / "on-disk" / "template.yaml").write_text("runtime: python3.14\n")
    (where / "functions" / "not-a-function").mkdir()
    (where / "state").mkdir()
    db = open_db(db_path(where / "state"))
    db.upsert("functions", "loaded", {"name": "loaded"}, "2026-01-01T00:00:00Z")
    db.close()
    assert function_names() == ["loaded", "on-disk"]


def test_dlq_ids_come_from_the_embedded_broker_file_newest_first(where: Path) -> None:
    assert dlq_ids() == []
    assert not (where / "broker.sqlite3").exists()
    conn = open_checked(where / "broker.sqlite3")
    entry = DeadLetterEntry(original_stream="events", original_id="1-1", group="relay",
                            consumer="c", event="{}", reason="handler_failed")  # fmt: skip
    written = [insert_dead_letter(conn, 1_700_000_000_000 + n, entry) for n in range(3)]
    conn.close()
    assert dlq_ids() == written[::-1]


def test_dlq_ids_on_a_redis_nobody_answers_offer_nothing(where: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELAY_BROKER")
    monkeypatch.setenv("REDIS_URI", "redis://127.0.0.1:1")
    monkeypatch.setenv("REDIS_STREAM", "events")
    assert dlq_ids() == []


def test_the_shell_completes_a_function_name(where: Path) -> None:
    (where / "functions" / "greeter").mkdir(parents=True)
    (where / "functions" / "greeter" / "template.yaml").write_text("runtime: python3.14\n")
    env = {**os.environ, "_RELAY_COMPLETE": "complete_bash",
           "COMP_WORDS": "relay function inspect gr", "COMP_CWORD": "3"}  # fmt: skip
    done = subprocess.run([RELAY], env=env, capture_output=True, text=True, timeout=60,
                          check=False, cwd=where)  # fmt: skip
    assert done.stdout.split() == ["greeter"], done.stderr
