"""The private parts of redis-py, aiodocker and aiohttp that Relay relies on.

Two hot paths take over a connection a library opened (``relay.adapters.takeover``):
the Redis ledger and reads (``adapters/redis/takeover.py``: redis-py's
``Connection._writer``) and each container's attach connection
(``adapters/docker/attach.py`` and ``containers.py``: aiodocker's ``Stream._init``
and ``Stream._resp``, then aiohttp's ``ClientResponse.connection.protocol.transport``).
No public API promises those, so ``pyproject.toml`` pins the three libraries to the
versions below and these tests check every part against a small fake server on
loopback (no Redis, no Docker). When one fails after moving a pin, read the new
release's source for the named attribute, adapt the adapter, and run the
integration tier (tests/integration/test_runtime.py, test_dispatch_redis.py).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any

import aiodocker
import aiodocker.stream
import anyio
import hiredis
import pytest
import redis.asyncio
import redis.asyncio.connection

from relay.adapters.docker.attach import AttachChannel, take_over
from relay.adapters.redis.takeover import dedicated_connection
from relay.adapters.takeover import TakenOver

pytestmark = pytest.mark.anyio

TESTED = {"redis": "8.1.0", "aiodocker": "0.27.0", "aiohttp": "3.14.5"}


def shape(library: str, what: str) -> str:
    """The failure message: which release was tested, what changed, what to do."""
    return (
        f"{library} {version(library)} (tested: {TESTED[library]}) changed {what}; "
        f"Relay relies on it (see this module's docstring): re-check the adapter "
        f"against the new release before moving the pin in pyproject.toml"
    )


def test_the_pins_are_the_tested_versions() -> None:
    for library, tested in TESTED.items():
        assert version(library) == tested, shape(library, "its version")


# --- redis-py ---------------------------------------------------------------------------
def test_redis_connection_shape() -> None:
    conn = redis.asyncio.connection.Connection()
    assert hasattr(conn, "_writer"), shape("redis", "Connection._writer (set in __init__)")
    assert conn._writer is None, shape("redis", "Connection._writer before connect")
    disconnect = inspect.signature(redis.asyncio.connection.Connection.disconnect)
    assert "nowait" in disconnect.parameters, shape("redis", "Connection.disconnect(nowait=)")
    assert inspect.iscoroutinefunction(redis.asyncio.connection.Connection.connect), shape(
        "redis", "Connection.connect (a coroutine)"
    )
    get = inspect.signature(redis.asyncio.ConnectionPool.get_connection)
    get.bind(redis.asyncio.ConnectionPool())  # callable with no argument
    assert inspect.iscoroutinefunction(redis.asyncio.ConnectionPool.get_connection), shape(
        "redis", "ConnectionPool.get_connection (a coroutine)"
    )


@asynccontextmanager
async def fake_redis() -> AsyncIterator[int]:
    """A loopback server that answers HELLO with a RESP3 map and anything else +OK."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser = hiredis.Reader()
        while data := await reader.read(65536):
            parser.feed(data)
            while (command := parser.gets()) is not False:
                if command[0].upper() == b"HELLO":
                    writer.write(b"%1\r\n$5\r\nproto\r\n:3\r\n")
                else:
                    writer.write(b"+OK\r\n")
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


class Recorder(TakenOver):
    def __init__(self) -> None:
        self.received = b""
        self.lost = anyio.Event()

    def data_received(self, data: bytes) -> None:
        self.received += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set()
        self.release_replaced(exc)


async def poll(condition: Callable[[], bool], what: str) -> None:
    with anyio.move_on_after(5):
        while not condition():  # noqa: ASYNC110 - polling a protocol's plain attribute
            await anyio.sleep(0.001)
    assert condition(), what


@pytest.mark.parametrize("protocol", [2, 3])
async def test_a_redis_connection_is_taken_over_and_closed_by_its_client(protocol: int) -> None:
    async with fake_redis() as port:
        client = redis.asyncio.Redis(host="127.0.0.1", port=port, protocol=protocol)
        taken = Recorder()
        await dedicated_connection(client)(taken)
        assert isinstance(taken.replaced, asyncio.StreamReaderProtocol), shape(
            "redis", "the protocol behind Connection._writer.transport"
        )
        taken.transport.write(b"*1\r\n$4\r\nPING\r\n")
        await poll(lambda: taken.received == b"+OK\r\n", shape("redis", "the taken-over stream"))
        # The pool still owns the connection: closing the client closes it, and the
        # replaced protocol hears of it (otherwise the close would wait forever).
        with anyio.fail_after(5):
            await client.aclose()
            await taken.lost.wait()


# --- aiodocker / aiohttp ----------------------------------------------------------------
def test_aiodocker_stream_shape() -> None:
    assert inspect.iscoroutinefunction(aiodocker.stream.Stream._init), shape(
        "aiodocker", "Stream._init (a coroutine)"
    )

    async def setup() -> Any:
        raise AssertionError("not called")

    stream = aiodocker.stream.Stream(None, setup)  # type: ignore[arg-type]  # never used
    assert "_resp" in vars(stream), shape("aiodocker", "Stream._resp")


FRAME = struct.pack(">BxxxL", 1, 5) + b"hello"


@asynccontextmanager
async def fake_engine() -> AsyncIterator[int]:
    """Enough of the Engine API for one attach: GET .../json, then the 101 upgrade
    (after which it answers 4 bytes on stdin with one stdout frame)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            request_line = head.split(b"\r\n", 1)[0]
            if b"/attach" in request_line:
                writer.write(
                    b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream"
                    b"\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
                )
                await reader.readexactly(4)  # a request on stdin: answer on stdout
                writer.write(FRAME)
                await reader.read()  # until the client closes
                break
            body = json.dumps({"Id": "abc", "Config": {"Tty": False}}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_an_attach_connection_is_taken_over_and_closed_by_aiodocker() -> None:
    async with fake_engine() as port:
        docker = aiodocker.Docker(url=f"http://127.0.0.1:{port}", api_version="v1.41")
        try:
            container = docker.containers.container("abc")
            stream = container.attach(stdin=True, stdout=True, stderr=True)
            with anyio.fail_after(5):
                await stream._init()
            assert stream._resp is not None, shape("aiodocker", "Stream._resp after _init")
            connection = stream._resp.connection
            assert connection is not None, shape("aiohttp", "ClientResponse.connection")
            assert connection.protocol is not None, shape("aiohttp", "Connection.protocol")
            assert connection.protocol.transport is not None, shape(
                "aiohttp", "the transport of Connection.protocol"
            )
            channel = take_over(stream)
            assert isinstance(channel, AttachChannel)
            channel.write(b"ping")
            frames: list[tuple[int, bytes]] = []

            def answered() -> bool:
                frame = channel.next_frame()
                if frame is not None:
                    frames.append(frame)
                return bool(frames)

            await poll(
                answered, shape("aiohttp", "the upgraded connection's transport (no answer)")
            )
            assert frames == [(1, b"hello")]
            closing: Awaitable[None] = stream.close()
            with anyio.fail_after(5):
                await closing
            await poll(lambda: channel.closed, shape("aiodocker", "Stream.close"))
        finally:
            await docker.close()
