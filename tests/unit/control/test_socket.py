from __future__ import annotations

import json
import socket
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from relay.adapters.control import client
from relay.adapters.control.lock import ProcessLock
from relay.adapters.control.protocol import (
    CONTROL_COMMANDS,
    MAX_ERROR_CHARS,
    decode_request,
    encode_request,
)
from relay.adapters.control.server import ControlServer
from relay.application.bus import MessageBus, Outcome
from relay.domain.commands import (
    ForceBreaker,
    GetBreaker,
    GetHealth,
    GetPoolState,
    InvokeFunction,
    ReplayDeadLetter,
    ResetStats,
    SyncGit,
)
from relay.domain.errors import RelayError
from relay.domain.messages import Command

pytestmark = pytest.mark.anyio


class Recorder:
    """Handlers that record the commands they were sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def pool(self, cmd: GetPoolState) -> Outcome[Any]:
        self.sent.append(cmd)
        if cmd.function == "missing":
            return Outcome(None)
        return Outcome({"capacity": 2, "containers": 1})

    async def reset(self, cmd: ResetStats) -> Outcome[None]:
        self.sent.append(cmd)
        return Outcome(None)

    async def invoke(self, cmd: InvokeFunction) -> Outcome[Any]:
        self.sent.append(cmd)
        raise RelayError(f'function "{cmd.function}" not found\nsecond line')

    def bus(self) -> MessageBus:
        return MessageBus(
            {GetPoolState: self.pool, ResetStats: self.reset, InvokeFunction: self.invoke}
        )


@asynccontextmanager
async def serving(run_dir: Path, **kwargs: Any) -> AsyncIterator[tuple[ControlServer, Recorder]]:
    rec = Recorder()
    with ProcessLock(run_dir) as lock:
        server = ControlServer(lock, rec.bus().send, **kwargs)
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            yield server, rec
            tg.cancel_scope.cancel()


async def call(path: Path, command: Command) -> Any:
    return await anyio.to_thread.run_sync(lambda: client.request(path, command, timeout=5))


async def raw_exchange(path: Path, payload: bytes) -> bytes:
    def run() -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(path))
            s.sendall(payload)
            out = b""
            while not out.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
            return out

    return await anyio.to_thread.run_sync(run)


async def test_round_trip_sends_the_bus_command(tmp_path: Path) -> None:
    async with serving(tmp_path / "r") as (server, rec):
        assert stat.S_IMODE(server.path.stat().st_mode) == 0o600
        assert await call(server.path, GetPoolState(function="fn")) == {
            "capacity": 2,
            "containers": 1,
        }
        assert await call(server.path, ResetStats()) is None
        assert rec.sent == [GetPoolState(function="fn"), ResetStats()]
        assert client.fetch_pool(server.path, "missing") is None
    assert not server.path.exists()  # removed on shutdown


async def test_relay_error_is_one_line_with_its_kind(tmp_path: Path) -> None:
    async with serving(tmp_path / "r") as (server, _):
        with pytest.raises(client.ControlRequestError) as info:
            await call(server.path, InvokeFunction(function="nope", event={"a": 1}))
        assert str(info.value) == 'function "nope" not found second line'
        assert info.value.kind == "RelayError"


def reply_of(raw: bytes) -> dict[str, Any]:
    assert raw.count(b"\n") == 1  # one line, whatever was wrong
    assert raw.endswith(b"\n")
    answer: dict[str, Any] = json.loads(raw)
    assert answer["ok"] is False
    return answer


BAD_REQUESTS = [
    (b"{not json", "invalid request: expected a JSON object (JSON is malformed"),
    (b"[1, 2]", "invalid request: expected a JSON object (Expected `object`, got `array`)"),
    (b'{"op": "reset_stats"}', 'invalid request: no protocol version "v" (this worker speaks 1;'),
    (b'{"v": 2, "command": {"cmd": "reset_stats"}}',
     "unsupported control protocol version 2 (this worker speaks 1;"),
    (b'{"v": true, "command": {"cmd": "reset_stats"}}',
     "unsupported control protocol version true"),
    (b'{"v": 1, "command": {"cmd": "fly"}}',
     "invalid request: Invalid value 'fly' - at `$.command.cmd`"),
    (b'{"v": 1, "command": {"cmd": "dispatch_batch", "messages": []}}',
     "invalid request: Invalid value 'dispatch_batch' - at `$.command.cmd`"),
    (b'{"v": 1, "command": {"cmd": "invoke_function", "function": "f", "event": [1, 2]}}',
     "invalid request: Expected `object`, got `array` - at `$.command.event`"),
    (b'{"v": 1, "command": {"cmd": "get_pool_state"}}',
     "invalid request: Object missing required field `function` - at `$.command`"),
    (b'{"v": 1, "command": {"cmd": "reset_stats", "everything": true}}',
     "invalid request: Object contains unknown field `everything` - at `$.command`"),
    (b'{"v": 1, "command": {"cmd": "reset_stats"}, "sudo": 1}',
     "invalid request: Object contains unknown field `sudo`"),
    (b'{"v": 1}', "invalid request: Object missing required field `command`"),
]


@pytest.mark.parametrize(("line", "error"), BAD_REQUESTS)
async def test_a_bad_request_gets_one_clear_error_line(
    tmp_path: Path, line: bytes, error: str
) -> None:
    async with serving(tmp_path / "r") as (server, rec):
        answer = reply_of(await raw_exchange(server.path, line + b"\n"))
        assert answer["kind"] == "ProtocolError"
        assert answer["error"].startswith(error), answer["error"]
        assert "Traceback" not in answer["error"]
        # the connection still serves a good request after a bad one
        assert await call(server.path, ResetStats()) is None
        assert rec.sent == [ResetStats()]


async def test_an_error_line_quotes_a_bounded_excerpt_only(tmp_path: Path) -> None:
    huge = "x" * 100_000
    async with serving(tmp_path / "r") as (server, rec):
        line = b'{"v": 1, "command": {"cmd": "%s"}}\n' % huge.encode()
        answer = reply_of(await raw_exchange(server.path, line))
        assert len(answer["error"]) <= MAX_ERROR_CHARS
        assert rec.sent == []


def test_the_cli_encodes_each_control_command_as_the_worker_decodes_it() -> None:
    samples: list[Command] = [
        GetPoolState(function="fn"), ResetStats(), InvokeFunction(function="f", event={"a": 1}),
        ReplayDeadLetter(entry_id="1-0"), GetHealth(), GetBreaker(function="f"),
        ForceBreaker(function="f", state="open"), SyncGit(directory="/functions"),
    ]
    assert {type(c) for c in samples} == set(CONTROL_COMMANDS)
    for command in samples:
        assert decode_request(encode_request(command)) == command
    assert encode_request(ResetStats()) == b'{"v":1,"command":{"cmd":"reset_stats"}}\n'


async def test_size_cap(tmp_path: Path) -> None:
    async with serving(tmp_path / "r", max_request_bytes=64) as (server, rec):
        with pytest.raises(client.ControlRequestError, match="request too large") as info:
            await call(server.path, GetPoolState(function="x" * 200))
        assert info.value.kind == "RequestTooLarge"
        assert rec.sent == []


async def test_read_timeout_answers_and_closes(tmp_path: Path) -> None:
    async with serving(tmp_path / "r", read_timeout=0.2) as (server, _):
        reply = await raw_exchange(server.path, b'{"v": 1, "command"')  # no newline
        assert b"request timed out" in reply


async def test_peer_uid_is_checked(tmp_path: Path) -> None:
    async with serving(tmp_path / "r", allowed_uids=frozenset({424242})) as (server, rec):
        with pytest.raises(client.ControlRequestError, match="permission denied") as info:
            await call(server.path, ResetStats())
        assert info.value.kind == "PermissionDenied"
        assert rec.sent == []


async def test_a_refused_peer_reads_the_refusal_even_when_its_send_breaks(
    tmp_path: Path,
) -> None:
    # The worker answers a refused peer and closes without reading. A request
    # larger than the socket's buffer is still being sent then, so the send
    # fails with a broken pipe every time: the refusal must still be reported.
    async with serving(tmp_path / "r", allowed_uids=frozenset({424242})) as (server, rec):
        with pytest.raises(client.ControlRequestError, match="permission denied"):
            await call(server.path, GetPoolState(function="x" * 4_000_000))
        assert rec.sent == []


async def test_stale_socket_is_replaced_after_the_lock(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(run_dir / "relay.sock"))  # a killed worker's leftover
    stale.close()
    with pytest.raises(client.WorkerUnavailable):
        client.request(run_dir / "relay.sock", ResetStats())
    async with serving(run_dir) as (server, _):
        assert await call(server.path, ResetStats()) is None


async def test_no_socket_without_the_lock(tmp_path: Path) -> None:
    lock = ProcessLock(tmp_path / "r")
    lock.close()
    server = ControlServer(lock, MessageBus({}).send)
    with pytest.raises(RelayError, match="process lock"):
        await server.serve()


def test_no_worker_is_worker_unavailable(tmp_path: Path) -> None:
    with pytest.raises(client.WorkerUnavailable, match="no relay worker is running"):
        client.request(tmp_path / "relay.sock", GetHealth())
    assert client.fetch_pool(tmp_path / "relay.sock", "fn") is None


async def test_connections_beyond_the_cap_wait_their_turn(tmp_path: Path) -> None:
    async with serving(tmp_path / "r", max_connections=1) as (server, rec):
        idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        idle.connect(str(server.path))  # holds the only slot without sending anything
        result: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def second() -> None:
                result.append(await call(server.path, ResetStats()))

            tg.start_soon(second)
            await anyio.wait_all_tasks_blocked()
            assert rec.sent == []  # the second request has not been served yet
            idle.close()
        assert result == [None]
        assert rec.sent == [ResetStats()]
