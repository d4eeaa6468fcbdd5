"""The lean consumer of ``bench/throughput.py``: Relay's external work per event
with hand-written protocols and nothing else, to show what this machine allows.

Per message it makes the same calls as ``bench/_floor.py`` (and Relay): a
batched ``XREADGROUP``, the ledger's real ``begin`` and ``finish`` Lua scripts
with the arguments Relay packs, and one request to one of N warm, hardened
execution containers running Relay's bootstrap, answered by the end-marker
frame. But Redis is spoken through an ``asyncio.Protocol`` with a hiredis
reader (replies resolve futures in order; writes are flushed once per loop
iteration), and each container gets a Unix socket of the lean consumer's own,
mounted as Relay mounts its own (``relay.adapters.docker.direct``): requests
and answers go over it, while the attach connection, opened by hand on the
Docker socket, stays open as Relay's does (a no-op handler prints nothing on
it). No timeouts, no
reconnects, no output forwarding, no error paths: it is a yardstick, not a
design. The distance between this row and ``adapters only`` is what the
layers of Relay's adapters cost; the libraries' own I/O is not the main part
(a hand-written attach connection inside ``DockerContainerRuntime`` saved
about 3 us per invocation).

Run as ``python bench/_lean.py URL STREAM GROUP IMAGE CONTAINERS`` (Docker on
its default Unix socket).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

import aiodocker
import hiredis
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _redisbench import redis_address, resp_command, run_consumer

from relay.adapters.docker.bootstraps import END_MARKER_PREFIX
from relay.adapters.docker.containers import ContainerSpec, container_config
from relay.adapters.docker.direct import SOCKET_NAME, DirectSocket, DirectSockets
from relay.adapters.redis.keys import dlq_key, invocation_key
from relay.adapters.redis.ledger import ACKED_TTL_S, load_script
from relay.domain.invocation import invocation_field

FIELD = invocation_field("bench", "bench.noop")
BUFFER = 16
DOCKER_SOCKET = "/var/run/docker.sock"
FS, RS = "\x1f", "\x1e"  # the ledger's argument packing (relay.adapters.redis.ledger)


class RespProtocol(asyncio.Protocol):
    """Pipelined RESP: replies come back in the order the calls were written."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.reader = hiredis.Reader()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.unsent: list[bytes] = []
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            future = self.waiting.popleft()
            if isinstance(reply, hiredis.ReplyError):
                future.set_exception(RuntimeError(str(reply)))
            else:
                future.set_result(reply)

    def call(self, packed: bytes) -> asyncio.Future[Any]:
        future = self.loop.create_future()
        self.waiting.append(future)
        if not self.unsent:
            self.loop.call_soon(self._flush)
        self.unsent.append(packed)
        return future

    def _flush(self) -> None:
        self.transport.write(b"".join(self.unsent))
        self.unsent.clear()


class AttachProtocol(asyncio.Protocol):
    """One container's hijacked attach connection: one request at a time."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.upgraded = self.loop.create_future()
        self.buffer = bytearray()
        self.stderr = bytearray()
        self.marker = b""
        self.answer: asyncio.Future[bytes] | None = None
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.upgraded.done():
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            self.upgraded.set_result(bytes(self.buffer[:end]))
            del self.buffer[: end + 4]
        while len(self.buffer) >= 8:
            size = int.from_bytes(self.buffer[4:8], "big")
            if len(self.buffer) < 8 + size:
                break
            if self.buffer[0] == 2:  # stderr: output, then the answer frame
                self.stderr += self.buffer[8 : 8 + size]
            del self.buffer[: 8 + size]
        at = self.stderr.find(self.marker) if self.marker else -1
        end = self.stderr.find(b"\n", at) if at >= 0 else -1
        if end >= 0 and self.answer is not None:
            answer, self.answer = self.answer, None
            answer.set_result(bytes(self.stderr[at + len(self.marker) : end]))
            del self.stderr[: end + 1]

    def request(self, frame: bytes, marker: bytes) -> asyncio.Future[bytes]:
        self.marker = marker
        self.answer = self.loop.create_future()
        self.transport.write(frame)
        return self.answer


async def attach(container_id: str) -> AttachProtocol:
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_unix_connection(AttachProtocol, DOCKER_SOCKET)
    protocol.transport.write(
        f"POST /containers/{container_id}/attach?stream=1&stdin=1&stdout=1&stderr=1 "
        "HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
        "Content-Length: 0\r\n\r\n".encode()
    )
    status = (await protocol.upgraded).split(b"\r\n", 1)[0]
    if b" 101 " not in status and b" 200 " not in status:
        raise SystemExit(f"lean: attach refused: {status!r}")
    return protocol


class SocketProtocol(asyncio.Protocol):
    """Relay's socket in one container: one request at a time, answered on it."""

    def __init__(self, connected: asyncio.Future[SocketProtocol]) -> None:
        self.connected = connected
        self.buffer = bytearray()
        self.answer: asyncio.Future[bytes] | None = None
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.connected.set_result(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\n")
        if end >= 0 and self.answer is not None:
            answer, self.answer = self.answer, None
            answer.set_result(bytes(self.buffer[:end]))
            del self.buffer[: end + 1]

    def request(self, frame: bytes) -> asyncio.Future[bytes]:
        self.answer = asyncio.get_running_loop().create_future()
        self.transport.write(frame)
        return self.answer


async def listen(directory: Path) -> tuple[asyncio.AbstractServer, asyncio.Future[SocketProtocol]]:
    os.mkdir(directory, mode=0o711)
    os.chmod(directory, 0o711)
    connected = asyncio.get_running_loop().create_future()
    path = directory / SOCKET_NAME
    server = await asyncio.get_running_loop().create_unix_server(
        lambda: SocketProtocol(connected), str(path)
    )
    os.chmod(path, 0o666)
    return server, connected


async def consume(url: str, stream: str, group: str, image: str, count: int) -> None:
    loop = asyncio.get_running_loop()
    host, port, _ = redis_address(url)
    _, reads = await loop.create_connection(RespProtocol, host, port)
    _, scripts = await loop.create_connection(RespProtocol, host, port)
    try:
        await reads.call(resp_command("XGROUP", "CREATE", stream, group, "0", "MKSTREAM"))
    except RuntimeError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    begin, finish = load_script("begin"), load_script("finish")
    for script in (begin, finish):
        await scripts.call(script.load_command())
    docker = aiodocker.Docker()
    spec = ContainerSpec(function="bench", image=image, runtime="python3.14", hostname="lean")
    containers, idle = [], asyncio.Queue[SocketProtocol]()
    attached: list[AttachProtocol] = []
    base = Path(tempfile.mkdtemp(prefix="relay-lean-"))
    places = asyncio.Semaphore(BUFFER)
    claims = FS.join((FIELD, "5", "15000"))

    async def handle(message_id: str, payload: bytes) -> None:
        try:
            keys = [invocation_key(stream, group, message_id), stream, dlq_key(stream)]
            head = FS.join((group, "lean", message_id, "2026-01-01T00:00:00.000Z"))
            head += FS + FS.join((str(ACKED_TTL_S), "0"))
            token = secrets.token_hex(16)
            began = await scripts.call(
                begin.evalsha(keys, [head, "matched:bench", token, claims, FIELD])
            )
            attempt = int(began[1][0][2])
            container = await idle.get()
            nonce = secrets.token_hex(12)
            frame = {
                "id": nonce,
                "handler": "bench.noop",
                "env": {"RELAY_HANDLER": "bench.noop"},
                "event": payload.decode(),
                "timeout_s": 5.0,
            }
            line = await container.request(msgspec.json.encode(frame) + b"\n")
            idle.put_nowait(container)
            answer = line.removeprefix(END_MARKER_PREFIX + nonce.encode())
            if not msgspec.json.decode(answer)["ok"]:
                raise SystemExit(f"lean: the handler failed: {answer!r}")
            report = FS.join((FIELD, str(attempt), "ok", ""))
            await scripts.call(finish.evalsha(keys, [head, token, report, FIELD, ""]))
        finally:
            places.release()

    try:
        for number in range(count):
            server, connected = await listen(base / str(number))
            direct = DirectSocket(base / str(number), DirectSockets(base))  # for its mount
            config = container_config(spec, direct)
            container = await docker.containers.create(config=config)
            containers.append(container)
            attached.append(await attach(container.id))
            await container.start()
            idle.put_nowait(await connected)
            server.close()
        tasks: set[asyncio.Task[None]] = set()
        while True:
            await places.acquire()
            free = 1
            while free < BUFFER and not places.locked():
                await places.acquire()
                free += 1
            read = ("GROUP", group, "lean", "COUNT", free, "BLOCK", 1000, "STREAMS", stream, ">")
            reply = await reads.call(resp_command("XREADGROUP", *read))
            taken = 0
            for _stream, entries in reply or ():
                for entry_id, fields in entries:
                    payload = fields[fields.index(b"event") + 1]
                    task = asyncio.ensure_future(handle(entry_id.decode(), payload))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    taken += 1
            for _ in range(free - taken):
                places.release()
    finally:
        for container in containers:
            await container.delete(force=True)
        await docker.close()


def main() -> None:
    run_consumer(consume)


if __name__ == "__main__":
    main()
