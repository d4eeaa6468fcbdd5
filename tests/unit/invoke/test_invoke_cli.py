from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from relay.adapters.control.lock import ProcessLock
from relay.adapters.control.server import ControlServer
from relay.application.bus import MessageBus, Outcome
from relay.domain.commands import InvokeFunction
from relay.domain.errors import RelayError
from relay.entrypoints.cli import app
from tests.json_schemas import assert_matches_schema


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RELAY_RUN_DIR", str(tmp_path / "run"))
    return tmp_path / "run"


class Worker:
    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer = answer
        self.sent: list[InvokeFunction] = []

    async def handle(self, cmd: InvokeFunction) -> Outcome[Any]:
        self.sent.append(cmd)
        if isinstance(self.answer, Exception):
            raise self.answer
        return Outcome(self.answer)


async def run_cli(run_dir: Path, worker: Worker, args: list[str], stdin: str | None = None) -> Any:
    with ProcessLock(run_dir) as lock:
        server = ControlServer(lock, MessageBus({InvokeFunction: worker.handle}).send)
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            result = await anyio.to_thread.run_sync(
                lambda: CliRunner().invoke(app, args, input=stdin)
            )
            tg.cancel_scope.cancel()
    return result


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("invoked", "line"),
    [(0, "No matching handlers"), (1, "Invoked 1 handler"), (3, "Invoked 3 handlers")],
)
async def test_summary_lines(run_dir: Path, invoked: int, line: str) -> None:
    worker = Worker({"invoked": invoked, "failed": 0, "error": ""})
    result = await run_cli(
        run_dir, worker, ["function", "invoke", "users", "--event", '{"event_name":"INSERT"}']
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == line + "\n"
    assert worker.sent == [InvokeFunction(function="users", event={"event_name": "INSERT"})]


@pytest.mark.anyio
async def test_event_from_stdin_and_file(run_dir: Path, tmp_path: Path) -> None:
    worker = Worker({"invoked": 1, "failed": 0, "error": ""})
    result = await run_cli(run_dir, worker, ["function", "invoke", "users"], stdin='{"a": 1}')
    assert result.exit_code == 0, result.output
    event_file = tmp_path / "event.json"
    event_file.write_text('{"b": 2}')
    result = await run_cli(run_dir, worker, ["function", "invoke", "users", "--file",
                                             str(event_file)])
    assert result.exit_code == 0, result.output
    assert [c.event for c in worker.sent] == [{"a": 1}, {"b": 2}]


@pytest.mark.anyio
async def test_handler_failure_is_an_error(run_dir: Path) -> None:
    error = 'function "users" handler "events.created.handler": boom'
    worker = Worker({"invoked": 2, "failed": 1, "error": error})
    result = await run_cli(run_dir, worker, ["function", "invoke", "users", "--event", "{}"])
    assert result.exit_code == 1
    assert result.stderr == f"relay: {error}\n"


@pytest.mark.anyio
async def test_unknown_function_is_an_error(run_dir: Path) -> None:
    worker = Worker(RelayError('function "nope" not found'))
    result = await run_cli(run_dir, worker, ["function", "invoke", "nope", "--event", "{}"])
    assert result.exit_code == 1
    assert result.stderr == 'relay: function "nope" not found\n'


def test_no_worker_is_an_error(run_dir: Path) -> None:
    result = CliRunner().invoke(app, ["function", "invoke", "users", "--event", "{}"])
    assert result.exit_code == 1
    assert "no relay worker is running" in result.stderr
    assert "needs a running worker" in result.stderr


def test_bad_event_input_fails_before_the_socket(run_dir: Path) -> None:
    both = CliRunner().invoke(app, ["function", "invoke", "u", "--event", "{}", "--file", "x"])
    assert both.exit_code == 2
    assert "mutually exclusive" in both.stderr
    array = CliRunner().invoke(app, ["function", "invoke", "u", "--event", "[1]"])
    assert array.exit_code == 2


@pytest.mark.anyio
async def test_each_handler_run_is_printed_before_the_summary(run_dir: Path) -> None:
    run = {"handler": "events.created.handler", "ok": True, "error": "", "duration_s": 0.5,
           "image": "relay-fn-users:abc", "output": ["User created: 7"], "output_dropped": 0,
           "result": '{"id": 7}', "result_size": 9}
    worker = Worker({"invoked": 1, "failed": 0, "error": "", "handlers": [run]})
    result = await run_cli(run_dir, worker, ["function", "invoke", "users", "--event", "{}"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "handler: events.created.handler",
        "image: relay-fn-users:abc",
        "output:",
        "  User created: 7",
        'returned: {"id": 7}',
        "duration: 0.500s",
        "",
        "Invoked 1 handler",
    ]


@pytest.mark.anyio
async def test_json_is_one_document_and_a_failure_exits_1(run_dir: Path) -> None:
    error = 'function "users" handler "events.created.handler": boom'
    run = {"handler": "events.created.handler", "ok": False, "error": error, "duration_s": 0.1,
           "image": "relay-fn-users:abc", "output": ["Traceback ..."], "output_dropped": 0,
           "result": None, "result_size": 0}
    worker = Worker({"invoked": 1, "failed": 1, "error": error, "handlers": [run]})
    result = await run_cli(
        run_dir, worker, ["function", "invoke", "users", "--event", "{}", "--json"]
    )
    assert result.exit_code == 1
    doc = assert_matches_schema(result.stdout)
    assert (doc["function"], doc["invoked"], doc["failed"], doc["error"]) == (
        "users", 1, 1, error
    )
    [shown] = doc["handlers"]
    assert (shown["ok"], shown["output"], shown["returned"]) == (False, ["Traceback ..."], False)
