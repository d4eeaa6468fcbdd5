"""The CLI's state-changing commands over the real control socket.

A worker composed by ``composition.compose()`` (on in-memory fakes) serves the real
control socket; the real ``relay`` command line sends its commands to it: ``stats
reset``, ``function breaker open|close`` and ``git sync`` change the live
worker's state through it, and take their offline path only when no worker runs.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs
from typer.testing import CliRunner, Result

from relay.adapters.control.client import WorkerUnavailable, request
from relay.adapters.control.lock import ProcessLock
from relay.adapters.control.server import ControlServer
from relay.domain.commands import GetBreaker, ReconcileAll, ResetStats
from relay.domain.git import GitSyncResult
from relay.entrypoints.cli import app
from tests.fakes_compose import FakeWorker

pytestmark = pytest.mark.anyio

TEMPLATE = """\
runtime: python3.14
breaker:
  failures: 3
events:
  - handler: main.handler
    pattern:
      kind: [hello]
"""
TRUSTED = "Trusted new host git.example.invalid (fingerprint SHA256:abc)"


class WorkerSync:
    """The worker's ``GitSyncer``: records each sync, answers one commit."""

    def __init__(self, functions_dir: Path) -> None:
        self.functions_dir = functions_dir
        self.syncs = 0

    async def sync_functions(self) -> GitSyncResult:
        self.syncs += 1
        return GitSyncResult(
            repository="git@git.example.invalid:acme/fns.git", ref="main", commit="c0ffee" * 7,
            directory=str(self.functions_dir), functions=["greeter", "other"],
            updated=["greeter"], trusted=[TRUSTED],
        )


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RELAY_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RELAY_RUN_DIR", str(tmp_path / "run"))
    functions = tmp_path / "functions" / "greeter"
    functions.mkdir(parents=True)
    (functions / "template.yaml").write_text(TEMPLATE)
    (functions / "main.py").write_text("def handler(event):\n    return None\n")
    return tmp_path


@asynccontextmanager
async def live_worker(dirs: Path) -> AsyncIterator[FakeWorker]:
    worker = FakeWorker(dirs / "functions", git=WorkerSync(dirs / "functions"))
    # the worker logs in this process: kept off the stdout the CLI's output is read from
    with capture_logs(), ProcessLock(dirs / "run") as lock:
        await worker.bus.send(ReconcileAll())
        server = ControlServer(lock, worker.bus.send)
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            yield worker
            tg.cancel_scope.cancel()


async def relay(*args: str) -> Result:
    return await anyio.to_thread.run_sync(lambda: CliRunner().invoke(app, list(args)))


async def test_stats_reset_is_sent_to_the_live_worker(dirs: Path) -> None:
    async with live_worker(dirs) as worker:
        result = await relay("stats", "reset")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "Statistics reset\n", "")
    assert worker.stats.resets == 1
    assert not (dirs / "state").exists()  # the worker owns the write, not the CLI


async def test_the_breaker_is_forced_on_the_live_worker(dirs: Path) -> None:
    async with live_worker(dirs) as worker:
        opened = await relay("function", "breaker", "open", "greeter")
        state = await worker.bus.send(GetBreaker(function="greeter"))
        closed = await relay("function", "breaker", "close", "greeter")
        unknown = await relay("function", "breaker", "open", "nope")
    assert opened.exit_code == 0, opened.output
    assert opened.stdout == (
        "greeter: breaker open (forced: held until `relay function breaker close greeter`)\n"
    )
    assert (state.state, state.forced) == ("open", True)
    assert (closed.exit_code, closed.stdout) == (0, "greeter: breaker closed\n")
    assert unknown.exit_code == 1
    assert unknown.stderr == 'relay: function "nope" not found on the worker\n'


async def test_git_sync_is_sent_to_the_live_worker_not_run_in_the_cli(dirs: Path) -> None:
    async with live_worker(dirs) as worker:
        result = await relay("git", "sync")
        same = await relay("git", "sync", "--functions", str(dirs / "functions"))
        other = await relay("git", "sync", "--functions", str(dirs / "elsewhere"))
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"{TRUSTED}\n"
        f"Synced git@git.example.invalid:acme/fns.git main at c0ffeec0ffee into "
        f"{dirs / 'functions'}: 2 function(s)\n"
        "  updated: greeter\n"
    )
    assert same.exit_code == 0, same.output
    assert other.exit_code == 1
    assert other.stderr == (
        f"relay: the running worker serves {dirs / 'functions'}, not {dirs / 'elsewhere'}: "
        "run `relay git sync` without --functions, or stop the worker first\n"
    )
    git = worker.git
    assert isinstance(git, WorkerSync)
    assert git.syncs == 2  # no git source is configured here: the CLI could not have synced
    assert not (dirs / "state").exists()


async def test_without_a_worker_the_commands_take_their_offline_path(dirs: Path) -> None:
    reset = await relay("stats", "reset")
    assert (reset.exit_code, reset.stdout) == (0, "Statistics reset\n")
    assert reset.stderr == (
        "relay: note: no worker is running: the state database was reset directly\n"
    )
    sync = await relay("git", "sync", "--functions", str(dirs / "functions"))
    assert sync.exit_code == 1  # ran here, in this process: and no source is configured
    assert sync.stderr == (
        "relay: no git source configured: run `relay git set <repository>` first\n"
    )
    breaker = await relay("function", "breaker", "open", "greeter")
    assert breaker.exit_code == 1  # a breaker lives only in a worker: no offline path
    assert "needs a running worker (`relay start`)" in breaker.stderr


async def test_a_worker_that_runs_but_does_not_answer_is_an_error_not_a_reason_to_go_offline(
    dirs: Path,
) -> None:
    (dirs / "run").mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(str(dirs / "run" / "relay.sock"))
        silent.listen()  # accepts into its backlog, never answers
        with pytest.raises(WorkerUnavailable) as info:
            request(dirs / "run" / "relay.sock", ResetStats(), timeout=0.2)
    assert not info.value.absent
    assert str(info.value) == "the relay worker did not answer within 0.2s"
    with pytest.raises(WorkerUnavailable) as gone:
        request(dirs / "run" / "relay.sock", ResetStats(), timeout=0.2)  # nobody listens now
    assert gone.value.absent
