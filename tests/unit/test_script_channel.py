"""ScriptChannel on an in-memory Redis connection: ordering, role hand-over, failures.

The fake speaks enough RESP to run the channel's two commands (``SCRIPT LOAD``
and ``EVALSHA``, whose "script" echoes its first argument) and yields at chosen
points, so the interleavings that lost a wake-up once are replayed on purpose.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from relay.adapters.redis.scripts import LuaScript, ScriptChannel, ScriptConnection
from relay.domain.errors import DependencyUnavailable

pytestmark = pytest.mark.anyio

ECHO = LuaScript("echo", "return ARGV[1]")
OTHER = LuaScript("other", "return ARGV[1] .. '!'")


def parse_commands(data: bytes) -> list[list[bytes]]:
    """RESP arrays of bulk strings, as the channel writes them."""
    commands: list[list[bytes]] = []
    at = 0
    while at < len(data):
        end = data.index(b"\r\n", at)
        count = int(data[at + 1 : end])
        at = end + 2
        parts: list[bytes] = []
        for _ in range(count):
            end = data.index(b"\r\n", at)
            size = int(data[at + 1 : end])
            parts.append(data[end + 2 : end + 2 + size])
            at = end + 2 + size + 2
        commands.append(parts)
    return commands


class FakeServer:
    """Script cache and the log of what ran, shared by every connection."""

    def __init__(self) -> None:
        self.scripts: dict[bytes, bytes] = {}
        self.ran: list[bytes] = []
        self.refuse = False
        self.frozen = False

    def execute(self, command: list[bytes]) -> Any:
        name = command[0].upper()
        if name == b"SCRIPT":
            source = command[2]
            sha = LuaScript("x", source.decode()).sha.encode()
            self.scripts[sha] = source
            return sha
        if name == b"EVALSHA":
            sha, nkeys = command[1], int(command[2])
            if sha not in self.scripts:
                return NoScriptError("NOSCRIPT No matching script.")
            arg = command[3 + nkeys]
            self.ran.append(arg)
            return arg + b"!" if self.scripts[sha] == OTHER.source.encode() else arg
        raise AssertionError(f"unexpected command {command!r}")


class FakeConnection:
    """One connection: replies queue up in order; ``yields`` decides where it
    gives other tasks a turn (the real one does on a full socket buffer)."""

    def __init__(self, server: FakeServer, rng: random.Random, yield_chance: float = 0.5) -> None:
        self.server = server
        self.rng = rng
        self.yield_chance = yield_chance
        self.connected = False
        self.replies: deque[Any] = deque()
        self.arrived = anyio.Event()
        self.break_after: int | None = None  # drop the connection after N replies
        self.send_gates: deque[anyio.Event] = deque()  # a send waits on the next one
        self.held: list[Any] | None = None  # replies kept back while not None
        self.sends = 0
        self.connects = 0

    @property
    def is_connected(self) -> bool:
        return self.connected

    async def connect(self) -> None:
        if self.server.refuse:
            raise RedisConnectionError("Connection refused")
        self.connected = True
        self.connects += 1
        self.replies.clear()

    async def disconnect(self, nowait: bool = False) -> None:
        self.connected = False
        self.arrived.set()

    async def _maybe_yield(self) -> None:
        if self.rng.random() < self.yield_chance:
            await anyio.lowlevel.checkpoint()

    async def send_packed_command(self, command: bytes, check_health: bool = True) -> None:
        if not self.connected:
            raise RedisConnectionError("Connection closed by server.")
        self.sends += 1
        await self._maybe_yield()
        if self.server.frozen:
            return
        for parsed in parse_commands(command):
            reply = self.server.execute(parsed)
            (self.held if self.held is not None else self.replies).append(reply)
        self.arrived.set()
        if self.send_gates:  # a slow write: the socket buffer is full
            await self.send_gates.popleft().wait()
        await self._maybe_yield()

    def release_held(self) -> None:
        self.replies.extend(self.held or ())
        self.held = None
        self.arrived.set()

    async def read_response(self) -> Any:
        await self._maybe_yield()
        while not self.replies:
            if not self.connected:
                raise RedisConnectionError("Connection closed by server.")
            self.arrived = anyio.Event()
            await self.arrived.wait()
        if self.break_after is not None:
            if self.break_after == 0:
                self.connected, self.break_after = False, None
                raise RedisConnectionError("Connection reset by peer")
            self.break_after -= 1
        reply = self.replies.popleft()
        if isinstance(reply, Exception):
            raise reply
        return reply


def channel_on(conn: FakeConnection, timeout_s: float = 5.0) -> ScriptChannel:
    async def open_connection() -> ScriptConnection:
        await conn.connect()
        return conn

    return ScriptChannel(open_connection, timeout_s=timeout_s)


async def run_callers(channel: ScriptChannel, rng: random.Random, callers: int) -> list[str]:
    """Callers arriving in bursts, each making two calls with other work between."""
    problems: list[str] = []

    async def caller(n: int) -> None:
        for step, script in enumerate((ECHO, OTHER, ECHO, OTHER)):
            arg = f"{n}-{step}"
            try:
                reply = await channel.call(script, [f"key:{n}"], [arg])
            except DependencyUnavailable as exc:
                problems.append(f"{arg}: {exc}")
                return
            expected = arg + ("!" if script is OTHER else "")
            if reply != expected.encode():
                problems.append(f"{arg}: got {reply!r}")
            for _ in range(rng.randrange(3)):
                await anyio.lowlevel.checkpoint()

    with anyio.fail_after(10):  # a lost wake-up parks callers until their deadline
        async with anyio.create_task_group() as tg:
            for n in range(callers):
                tg.start_soon(caller, n)
                if rng.random() < 0.3:
                    await anyio.lowlevel.checkpoint()
    return problems


@pytest.mark.parametrize("seed", range(40))
async def test_every_caller_gets_its_own_reply_under_any_interleaving(seed: int) -> None:
    rng = random.Random(seed)
    server = FakeServer()
    channel = channel_on(FakeConnection(server, rng), timeout_s=8.0)
    assert await run_callers(channel, rng, callers=60) == []
    assert len(server.ran) == 240
    assert channel.round_trips < channel.calls  # calls shared pipelines


async def test_a_writer_whose_call_was_answered_meanwhile_hands_on_what_it_wrote_after() -> None:
    """The lost wake-up found by bench/throughput.py: while A's write was slow,
    another caller read A's reply; A then wrote Y's call and returned without
    reading it. Y must still be answered, not wait for its deadline."""
    conn = FakeConnection(FakeServer(), random.Random(0), yield_chance=0.0)  # only the gates
    channel = channel_on(conn, timeout_s=2.0)  # a parked caller fails after this
    await channel.call(ECHO, [], ["warm"])  # connected, script loaded
    replies: dict[str, bytes] = {}

    async def call(arg: str) -> None:
        replies[arg] = await channel.call(ECHO, [], [arg])

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            conn.held = []
            tg.start_soon(call, "r0")  # writes batch 1, then reads: its reply is held
            await anyio.wait_all_tasks_blocked()
            gate = anyio.Event()
            conn.send_gates.append(gate)
            tg.start_soon(call, "a")  # writer of batch 2; its send will hang
            tg.start_soon(call, "x")  # joins batch 2, parks
            await anyio.wait_all_tasks_blocked()
            conn.release_held()  # r0 reads batch 1, hands reading to x; x reads a and x
            await anyio.wait_all_tasks_blocked()
            assert replies.keys() == {"r0", "x"}  # a's reply is read; a is still writing
            tg.start_soon(call, "y")  # arrives while a is still writing: parks
            await anyio.wait_all_tasks_blocked()
            gate.set()  # a writes batch 3 (y), then finds its own call answered
    assert replies == {"r0": b"r0", "a": b"a", "x": b"x", "y": b"y"}


async def test_a_script_is_loaded_once_per_connection_ahead_of_its_first_call() -> None:
    server = FakeServer()
    conn = FakeConnection(server, random.Random(1))
    channel = channel_on(conn)
    assert await channel.call(ECHO, [], ["a"]) == b"a"
    assert await channel.call(ECHO, [], ["b"]) == b"b"
    assert list(server.scripts) == [ECHO.sha.encode()]
    assert conn.sends == 2  # the load travelled with the first call


async def test_a_flushed_script_is_loaded_again_and_the_call_sent_again() -> None:
    server = FakeServer()
    channel = channel_on(FakeConnection(server, random.Random(2)))
    await channel.call(ECHO, [], ["a"])
    server.scripts.clear()  # SCRIPT FLUSH, or a restart that kept the connection
    assert await channel.call(ECHO, [], ["b"]) == b"b"
    assert server.ran == [b"a", b"b"]


async def test_calls_a_broken_connection_left_unanswered_are_sent_once_more() -> None:
    server = FakeServer()
    conn = FakeConnection(server, random.Random(3))
    channel = channel_on(conn)
    await channel.call(ECHO, [], ["warm"])
    conn.break_after = 0  # the next read finds the connection reset

    async def one(arg: str, into: list[bytes]) -> None:
        into.append(await channel.call(ECHO, [], [arg]))

    replies: list[bytes] = []
    async with anyio.create_task_group() as tg:
        for arg in ("a", "b", "c"):
            tg.start_soon(one, arg, replies)
    assert sorted(replies) == [b"a", b"b", b"c"]
    assert conn.connects == 2
    # At-least-once: the first sending ran on the server too (fenced scripts allow it).
    assert sorted(server.ran) == [b"a", b"a", b"b", b"b", b"c", b"c", b"warm"]


async def test_a_refused_connection_fails_the_call_with_one_clear_error() -> None:
    server = FakeServer()
    server.refuse = True
    channel = channel_on(FakeConnection(server, random.Random(4)))
    with pytest.raises(DependencyUnavailable, match=r"redis ledger connection failed: .*refused"):
        await channel.call(ECHO, [], ["a"])
    server.refuse = False
    assert await channel.call(ECHO, [], ["b"]) == b"b"  # the next call connects again


async def test_an_unanswered_call_times_out_and_the_channel_recovers() -> None:
    server = FakeServer()
    conn = FakeConnection(server, random.Random(5))
    channel = channel_on(conn, timeout_s=0.2)
    await channel.call(ECHO, [], ["warm"])
    server.frozen = True  # takes commands, never answers (SIGSTOP, a partition)
    with pytest.raises(DependencyUnavailable, match=r"timed out|not answered"):
        await channel.call(ECHO, [], ["lost"])
    server.frozen = False
    assert await channel.call(ECHO, [], ["after"]) == b"after"
    assert conn.connects == 2  # the frozen connection was dropped, not reused
