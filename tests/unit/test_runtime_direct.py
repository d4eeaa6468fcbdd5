"""Relay's socket in each execution container (``relay.adapters.docker.direct``):
the Relay side of the protocol on scripted connections, and the listening
sockets on real Unix sockets (no Docker)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from relay.adapters.docker.attach import AttachChannel, DeadlinePassed
from relay.adapters.docker.containers import (
    ContainerSpec,
    ExecutionContainer,
    ProcessExited,
    container_config,
)
from relay.adapters.docker.direct import (
    MAX_PENDING_BYTES,
    MOUNT_TARGET,
    SOCKET_NAME,
    DirectLink,
    DirectSocket,
    DirectSockets,
)
from relay.adapters.docker.lines import ProtocolError
from relay.bootstrap import _direct_dir
from relay.domain.execution import InvocationRequest
from tests.unit.attach_frames import STDERR, Message, mux

pytestmark = pytest.mark.anyio

REQUEST = InvocationRequest(function="fn", handler="mod.h", event=b"{}", context="1-0")
PREFIX = 'relay: function "fn" handler "mod.h" message "1-0": '
SPEC = ContainerSpec(function="fn", image="img", runtime="python3.14", hostname="h")


def socket_answer(nonce: str, out: int, ok: bool = True, error: str = "") -> bytes:
    body = json.dumps({"ok": ok, "error": error, "out": out}).encode()
    return b"\x1erelay-end:" + nonce.encode() + body + b"\n"


# what the scripted container does after a request: ("err", bytes) on the attach
# stream's stderr; ("socket", bytes) on the socket; "close socket" / "close attach"
Step = tuple[str, bytes] | str
Script = Callable[[str], Sequence[Step]]


class Peer:
    """Both of a scripted container's connections; each step lands in its own loop turn."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.channel: AttachChannel | None = None
        self.link: DirectLink | None = None

    def received(self, way: str, data: bytes) -> None:
        request = json.loads(data)
        self.requests.append((way, request))
        loop = asyncio.get_running_loop()
        for turn, step in enumerate(self.script(request["id"]), start=1):
            loop.call_later(0.001 * turn, self._do, step)

    def _do(self, step: Step) -> None:
        assert self.channel is not None
        assert self.link is not None
        if step == "close socket":
            self.link.connection_lost(None)
        elif step == "close attach":
            self.channel.connection_lost(None)
        elif isinstance(step, tuple) and step[0] == "err":
            self.channel.data_received(mux(Message(STDERR, step[1])))
        elif isinstance(step, tuple):
            self.link.data_received(step[1])


class Side:
    """One end's transport, handing what Relay writes to the peer."""

    def __init__(self, peer: Peer, way: str) -> None:
        self.peer, self.way = peer, way
        self.closing = False

    def write(self, data: bytes) -> None:
        self.peer.received(self.way, data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None


def make(
    script: Script, tmp_path: Path, *, connected: bool = True
) -> tuple[ExecutionContainer, Peer]:
    peer = Peer(script)
    channel = peer.channel = AttachChannel(Side(peer, "stdin"))
    direct = DirectSocket(tmp_path / "c", DirectSockets(tmp_path))
    direct.notify(channel.wake)
    link = peer.link = direct._accept()
    if connected:
        link.connection_made(Side(peer, "socket"))
    container = ExecutionContainer(
        spec=SPEC, container=None, stream=None, channel=channel, direct=direct
    )
    return container, peer


async def call(
    container: ExecutionContainer, timeout_s: float = 6.0
) -> tuple[tuple[bool, str], list[str]]:
    lines: list[str] = []
    answer = await container.call(REQUEST, timeout_s, lines.append)
    return (answer.ok, answer.error), lines


async def test_a_silent_handler_is_asked_and_answered_on_the_socket(tmp_path: Path) -> None:
    container, peer = make(lambda nonce: [("socket", socket_answer(nonce, 0))], tmp_path)
    assert await call(container) == ((True, ""), [])
    assert [way for way, _ in peer.requests] == ["socket"]


async def test_the_answer_waits_for_the_output_it_counts(tmp_path: Path) -> None:
    # the answer overtakes the output (it does not pass the engine): still last
    container, _ = make(
        lambda nonce: [
            ("socket", socket_answer(nonce, 12, ok=False, error="E")),
            ("err", b"one\n"),
            ("err", b"two\nthree"),
        ],
        tmp_path,
    )
    result, lines = await call(container)
    assert result == (False, "E")
    assert lines == [PREFIX + "one", PREFIX + "two", PREFIX + "three"]


async def test_output_after_the_counted_bytes_is_not_waited_for(tmp_path: Path) -> None:
    container, _ = make(
        lambda nonce: [("err", b"mine\n"), ("socket", socket_answer(nonce, 5))], tmp_path
    )
    assert await call(container) == ((True, ""), [PREFIX + "mine"])
    # the second call's count includes the first's bytes: it does not wait again
    container2, _ = make(lambda nonce: [("socket", socket_answer(nonce, 0))], tmp_path)
    assert (await call(container2))[0] == (True, "")


async def test_before_the_bootstrap_connects_the_request_goes_to_stdin(tmp_path: Path) -> None:
    container, peer = make(
        lambda nonce: [("socket", socket_answer(nonce, 0))], tmp_path, connected=False
    )
    assert peer.link is not None
    link = peer.link
    # it connects while the first request is served: the answer comes on the socket
    asyncio.get_running_loop().call_soon(link.connection_made, Side(peer, "socket"))
    assert (await call(container))[0] == (True, "")
    assert (await call(container))[0] == (True, "")
    assert [way for way, _ in peer.requests] == ["stdin", "socket"]


async def test_a_closed_socket_waits_for_the_end_of_the_output_then_is_an_exit(
    tmp_path: Path,
) -> None:
    container, _ = make(
        lambda _: ["close socket", ("err", b"last words\n"), "close attach"], tmp_path
    )
    with pytest.raises(ProcessExited):
        await call(container)


async def test_the_output_before_an_exit_is_forwarded(tmp_path: Path) -> None:
    lines: list[str] = []
    container, _ = make(
        lambda _: ["close socket", ("err", b"last words\n"), "close attach"], tmp_path
    )
    with pytest.raises(ProcessExited):
        await container.call(REQUEST, 6.0, lines.append)
    assert lines == [PREFIX + "last words"]


async def test_an_answer_whose_output_never_comes_ends_with_the_attach_stream(
    tmp_path: Path,
) -> None:
    container, _ = make(
        lambda nonce: [("socket", socket_answer(nonce, 100)), ("err", b"x\n"), "close attach"],
        tmp_path,
    )
    assert await call(container) == ((True, ""), [PREFIX + "x"])


async def test_no_answer_on_either_way_is_a_deadline(tmp_path: Path) -> None:
    container, _ = make(lambda _: [], tmp_path)
    with pytest.raises(DeadlinePassed):
        await call(container, timeout_s=0.05)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b'\x1erelay-end:wrong{"ok": true, "error": "", "out": 0}\n', id="nonce"),
        pytest.param(b"anything\n", id="not-a-frame"),
    ],
)
async def test_anything_but_this_requests_answer_on_the_socket_is_a_protocol_error(
    tmp_path: Path, line: bytes
) -> None:
    container, _ = make(lambda _: [("socket", line)], tmp_path)
    with pytest.raises(ProtocolError):
        await call(container)


async def test_an_answer_on_the_socket_without_a_count_is_a_protocol_error(
    tmp_path: Path,
) -> None:
    frame = b'{"ok": true, "error": ""}\n'
    container, _ = make(
        lambda nonce: [("socket", b"\x1erelay-end:" + nonce.encode() + frame)], tmp_path
    )
    with pytest.raises(ProtocolError, match="does not count"):
        await call(container)


async def test_a_socket_flooded_while_idle_is_cut_off_and_its_container_not_reused(
    tmp_path: Path,
) -> None:
    # newlines do not make a flood acceptable: the bound is on bytes held
    container, peer = make(lambda nonce: [], tmp_path)
    link = peer.link
    assert link is not None
    for _ in range(40):
        link.data_received(b"x\n" * 1000)
    assert link.broken
    assert len(link.buffer) == 0
    assert link.peak <= MAX_PENDING_BYTES
    assert not link.usable()  # Relay closed it: the bootstrap leaves
    assert container.exited()  # so the pool discards it before it serves again


async def test_a_socket_flooded_during_a_request_fails_it_with_one_clear_line(
    tmp_path: Path,
) -> None:
    container, peer = make(lambda nonce: [("socket", b"y\n" * 40_000)], tmp_path)
    with pytest.raises(ProtocolError) as raised:
        await call(container)
    assert str(raised.value) == (
        f"the socket carried more than {MAX_PENDING_BYTES} bytes that are not an answer"
    )
    assert peer.link is not None
    assert len(peer.link.buffer) == 0


async def test_a_bootstrap_that_could_not_connect_turns_the_sockets_off_once(
    tmp_path: Path,
) -> None:
    def on_stderr(nonce: str) -> list[Step]:
        body = json.dumps({"ok": True, "error": "", "channel": "cannot connect: denied"})
        return [("err", b"\x1erelay-end:" + nonce.encode() + body.encode() + b"\n")]

    container, _ = make(on_stderr, tmp_path, connected=False)
    assert container.direct is not None
    sockets = container.direct.owner
    with capture_logs() as logs:
        assert (await call(container))[0] == (True, "")
        assert (await call(container))[0] == (True, "")
    assert not sockets.on
    assert "cannot connect: denied" in sockets.off_reason
    assert [entry["event"] for entry in logs] == ["direct_socket_off"]
    assert await sockets.open() is None


# --- the listening sockets, for real ---------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: a Unix socket's path has at most 107 bytes
    (pytest's own temporary directories are too deep)."""
    path = Path(tempfile.mkdtemp(prefix="rd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_base_too_deep_for_a_socket_path_still_listens(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100) / "containers"
    direct = await DirectSockets(deep).open()
    assert direct is not None
    path = direct.directory / SOCKET_NAME
    assert len(str(path)) > 107
    woken = asyncio.Event()
    direct.notify(woken.set)
    # connect as the bootstrap would through its short mount point: here, a descriptor
    fd = os.open(direct.directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _, writer = await asyncio.open_unix_connection(f"/proc/self/fd/{fd}/{SOCKET_NAME}")
    finally:
        os.close(fd)
    await asyncio.wait_for(woken.wait(), 10)
    assert direct.link is not None
    writer.close()
    direct.close()


async def test_a_socket_per_container_in_a_private_directory(short_dir: Path) -> None:
    base = short_dir / "containers"
    sockets = DirectSockets(base)
    direct = await sockets.open()
    assert direct is not None
    assert direct.directory.parent == base
    assert stat.S_IMODE(base.stat().st_mode) == 0o711
    assert stat.S_IMODE(direct.directory.stat().st_mode) == 0o711
    path = direct.directory / SOCKET_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o666
    assert direct.mount() == {
        "Type": "bind",
        "Source": str(direct.directory),
        "Target": MOUNT_TARGET,
        "ReadOnly": True,
    }
    config = container_config(SPEC, direct)
    assert f"RELAY_CHANNEL={MOUNT_TARGET}/{SOCKET_NAME}" in config["Env"]
    assert config["HostConfig"]["Mounts"] == [direct.mount()]
    assert "Mounts" not in container_config(SPEC)["HostConfig"]
    direct.close()
    assert not direct.directory.exists()


async def test_only_the_first_connection_is_kept(short_dir: Path) -> None:
    sockets = DirectSockets(short_dir / "containers")
    direct = await sockets.open()
    assert direct is not None
    woken = asyncio.Event()
    direct.notify(woken.set)
    path = str(direct.directory / SOCKET_NAME)
    first_reader, first_writer = await asyncio.open_unix_connection(path)
    await asyncio.wait_for(woken.wait(), 10)  # the link wakes its reader when made
    assert direct.link is not None
    assert direct.link.usable()
    # the listener is closed once the bootstrap connected: nobody else gets in
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_unix_connection(path)
    woken.clear()
    first_writer.write(b"hello\n")
    await first_writer.drain()
    await asyncio.wait_for(woken.wait(), 10)
    assert direct.link.take_line() == b"hello"
    direct.close()
    assert await first_reader.read() == b""  # closed by Relay
    first_writer.close()


async def test_leftovers_of_a_killed_worker_are_removed(short_dir: Path) -> None:
    base = short_dir / "containers"
    (base / "old").mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(base / "old" / SOCKET_NAME))
    stale.close()
    direct = await DirectSockets(base).open()
    assert direct is not None
    assert sorted(p.name for p in base.iterdir()) == [direct.directory.name]
    direct.close()


async def test_a_base_it_cannot_use_turns_the_sockets_off_with_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    sockets = DirectSockets(blocker / "containers")
    with capture_logs() as logs:
        assert await sockets.open() is None
        assert await sockets.open() is None
    assert not sockets.on
    assert [entry["event"] for entry in logs] == ["direct_socket_off"]
    assert str(blocker / "containers") in logs[0]["reason"]
    assert blocker.read_text() == "not a directory"


class _Engine:
    """What the composition root reads of the Docker client: where the engine is."""

    def __init__(self, docker_host: str) -> None:
        self.docker_host = docker_host


def test_a_local_engine_gets_the_sockets_and_a_remote_one_is_said_once() -> None:
    wanted = Path("/run/relay/containers")
    with capture_logs() as logs:
        assert _direct_dir(_Engine("unix:///var/run/docker.sock"), wanted) == wanted
        assert _direct_dir(_Engine("tcp://socket-proxy:2375"), wanted) is None
    (line,) = logs
    assert line["event"] == "direct_socket_off"
    assert "tcp://socket-proxy:2375" in line["reason"]


def test_a_directory_the_operator_says_the_engine_shares_is_used_over_tcp() -> None:
    # RELAY_DIRECT_DIR (compose.dev.yaml): a host directory at the same path in relay
    wanted = Path("/run/relay-sockets/relay-dev/containers")
    with capture_logs() as logs:
        assert _direct_dir(_Engine("tcp://socket-proxy:2375"), wanted, shared=True) == wanted
    assert logs == []
