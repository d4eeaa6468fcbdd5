"""ScriptChannel on an in-memory connection: ordering, batching, failures, cancellation.

The fake sits where the channel meets the network: an opener that attaches the
channel's protocol to a fake transport. Written bytes are parsed as RESP and run
by a fake server (``SCRIPT LOAD``, and ``EVALSHA`` whose "script" echoes its
first argument); the replies come back as RESP bytes through ``data_received``,
cut into random chunks delivered on later loop iterations, so partial replies
and calls made while replies are in flight are exercised on purpose.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from relay.adapters.redis.scripts import LuaScript, ScriptChannel
from relay.domain.errors import DependencyUnavailable
from tests.fakes import ClosingTransport

pytestmark = pytest.mark.anyio

ECHO = LuaScript("echo", "return ARGV[1]")
OTHER = LuaScript("other", "return ARGV[1] .. '!'")
FAILS = LuaScript("fails", "return redis.error_reply('ERR no such key')")


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
        self.loads = 0
        self.refuse = False

    def execute(self, command: list[bytes]) -> bytes:
        name = command[0].upper()
        if name == b"SCRIPT":
            source = command[2]
            sha = LuaScript("x", source.decode()).sha.encode()
            self.scripts[sha] = source
            self.loads += 1
            return b"$40\r\n%s\r\n" % sha
        if name == b"EVALSHA":
            sha, nkeys = command[1], int(command[2])
            if sha not in self.scripts:
                return b"-NOSCRIPT No matching script. Please use EVAL.\r\n"
            source = self.scripts[sha]
            if source == FAILS.source.encode():
                return b"-ERR no such key\r\n"
            arg = command[3 + nkeys]
            self.ran.append(arg)
            reply = arg + b"!" if source == OTHER.source.encode() else arg
            return b"$%d\r\n%s\r\n" % (len(reply), reply)
        raise AssertionError(f"unexpected command {command!r}")


class FakeTransport(ClosingTransport):
    """One connection. Replies arrive in random chunks on later loop iterations
    (``chunky``); ``frozen`` takes commands and never answers; ``held`` keeps
    replies back until released; ``reset_after`` resets the connection after
    that many more replies."""

    def __init__(self, server: FakeServer, protocol: asyncio.Protocol, rng: random.Random) -> None:
        super().__init__(protocol)
        self.server = server
        self.rng = rng
        self.writes: list[bytes] = []
        self.frozen = False
        self.held: bytearray | None = None
        self.reset_after: int | None = None
        self.inflight = bytearray()
        self.pumping = False
        self.resetting = False

    # what the channel calls
    def write(self, data: bytes) -> None:
        if self.closed:
            return
        self.writes.append(data)
        if self.frozen:
            return
        for command in parse_commands(data):
            reply = self.server.execute(command)  # it runs even if its reply is lost
            if self.resetting:
                continue
            if self.reset_after == 0:
                self.resetting = True  # after what is in flight, the connection resets
                self._deliver(b"")
                continue
            if self.reset_after is not None:
                self.reset_after -= 1
            if self.held is not None:
                self.held += reply
            else:
                self._deliver(reply)

    # test controls
    def _deliver(self, data: bytes) -> None:
        """In order, like TCP: a random chunk of what is in flight per loop iteration."""
        self.inflight += data
        if not self.pumping:
            self.pumping = True
            self.loop.call_soon(self._pump)

    def _pump(self) -> None:
        if self.closed:
            self.inflight.clear()
        size = self.rng.randrange(1, 48)
        chunk, self.inflight[:size] = bytes(self.inflight[:size]), b""
        if chunk and self.rng.random() < 0.7:
            self._feed(chunk)
        else:
            self.inflight[:0] = chunk  # nothing this iteration
        if self.inflight:
            self.loop.call_soon(self._pump)
            return
        self.pumping = False
        if self.resetting and not self.closed:
            self.closed = True
            self.protocol.connection_lost(ConnectionResetError("Connection reset by peer"))

    def _feed(self, chunk: bytes) -> None:
        if not self.closed:
            self.protocol.data_received(chunk)

    def release_held(self) -> None:
        held, self.held = self.held, None
        self.protocol.data_received(bytes(held or b""))

    def server_closes(self) -> None:
        self.closed = True
        self.protocol.connection_lost(None)


class Network:
    """The opener: every connection opened, in order."""

    def __init__(self, server: FakeServer, seed: int = 0) -> None:
        self.server = server
        self.rng = random.Random(seed)
        self.transports: list[FakeTransport] = []
        self.connect_gate: anyio.Event | None = None  # opening waits on it when set
        self.reset_new: list[int] = []  # reset_after for the next connections opened

    @property
    def current(self) -> FakeTransport:
        return self.transports[-1]

    async def open(self, protocol: asyncio.Protocol) -> None:
        await anyio.lowlevel.checkpoint()
        if self.connect_gate is not None:
            await self.connect_gate.wait()
        if self.server.refuse:
            raise RedisConnectionError("Error 111 connecting to redis:6379. Connection refused.")
        transport = FakeTransport(self.server, protocol, self.rng)
        if self.reset_new:
            transport.reset_after = self.reset_new.pop(0)
        self.transports.append(transport)
        protocol.connection_made(transport)  # type: ignore[arg-type]  # a fake transport


def channel_on(network: Network, timeout_s: float = 5.0) -> ScriptChannel:
    return ScriptChannel(network.open, timeout_s=timeout_s)


async def run_callers(channel: ScriptChannel, rng: random.Random, callers: int) -> list[str]:
    """Callers arriving in bursts, each making four calls with other work between."""
    problems: list[str] = []

    async def caller(n: int) -> None:
        for step, script in enumerate((ECHO, OTHER, ECHO, OTHER)):
            arg = f"{n}-{step}"
            try:
                reply = await channel.call(script, [f"key:{n}"], [arg, "x" * rng.randrange(40)])
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
    network = Network(server, seed)
    channel = channel_on(network, timeout_s=8.0)
    assert await run_callers(channel, rng, callers=60) == []
    assert len(server.ran) == 240
    assert len(network.transports) == 1
    assert channel.calls == 240
    assert channel.round_trips < channel.calls  # calls shared writes


@pytest.mark.parametrize("seed", range(10))
async def test_a_reset_in_the_middle_of_a_run_loses_no_call(seed: int) -> None:
    rng = random.Random(seed)
    server = FakeServer()
    network = Network(server, seed)
    channel = channel_on(network, timeout_s=8.0)
    await channel.call(ECHO, [], ["warm"])
    network.current.reset_after = rng.randrange(1, 200)
    assert await run_callers(channel, rng, callers=60) == []
    assert len(network.transports) == 2
    assert len(set(server.ran)) == 241  # some ran twice: sent again after the reset


async def test_the_calls_of_one_loop_iteration_share_one_write() -> None:
    network = Network(FakeServer())
    channel = channel_on(network)
    await channel.call(ECHO, [], ["warm"])
    writes_before = len(network.current.writes)
    replies: dict[str, bytes] = {}

    async def call(arg: str) -> None:
        replies[arg] = await channel.call(ECHO, [], [arg])

    async with anyio.create_task_group() as tg:
        for arg in "abcdefgh":
            tg.start_soon(call, arg)
    assert replies == {arg: arg.encode() for arg in "abcdefgh"}
    assert len(network.current.writes) == writes_before + 1


async def test_a_new_call_is_written_while_earlier_replies_are_still_due() -> None:
    network = Network(FakeServer())
    channel = channel_on(network)
    await channel.call(ECHO, [], ["warm"])
    network.current.held = bytearray()  # replies do not come back for now
    replies: dict[str, bytes] = {}

    async def call(arg: str) -> None:
        replies[arg] = await channel.call(ECHO, [], [arg])

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "first")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(call, "second")
            await anyio.wait_all_tasks_blocked()
            await anyio.lowlevel.checkpoint()  # the flush runs at the end of an iteration
            assert [parse_commands(w)[0][3] for w in network.current.writes[-2:]] == [
                b"first",
                b"second",
            ]
            assert replies == {}
            network.current.release_held()
    assert replies == {"first": b"first", "second": b"second"}


async def test_a_script_is_loaded_once_per_connection_ahead_of_its_first_call() -> None:
    server = FakeServer()
    network = Network(server)
    channel = channel_on(network)
    assert await channel.call(ECHO, [], ["a"]) == b"a"
    assert await channel.call(ECHO, [], ["b"]) == b"b"
    assert list(server.scripts) == [ECHO.sha.encode()]
    first = parse_commands(network.current.writes[0])
    assert [command[0] for command in first] == [b"SCRIPT", b"EVALSHA"]  # one write
    assert len(network.current.writes) == 2


async def test_a_flushed_script_is_loaded_again_and_the_call_sent_again() -> None:
    server = FakeServer()
    channel = channel_on(Network(server))
    await channel.call(ECHO, [], ["a"])
    server.scripts.clear()  # SCRIPT FLUSH, or a restart that kept the connection
    assert await channel.call(ECHO, [], ["b"]) == b"b"
    assert server.ran == [b"a", b"b"]


async def test_concurrent_calls_after_a_flush_all_succeed_with_few_loads() -> None:
    server = FakeServer()
    channel = channel_on(Network(server))
    await channel.call(ECHO, [], ["warm"])
    server.scripts.clear()
    replies: list[bytes] = []

    async def call(arg: str) -> None:
        replies.append(await channel.call(ECHO, [], [arg]))

    async with anyio.create_task_group() as tg:
        for n in range(20):
            tg.start_soon(call, str(n))
    assert sorted(replies) == sorted(str(n).encode() for n in range(20))
    assert server.loads == 2  # the first connection's, then one for the whole batch


async def test_an_error_reply_fails_only_its_own_call_with_the_message() -> None:
    channel = channel_on(Network(FakeServer()))
    results: dict[str, Any] = {}

    async def call(script: LuaScript, arg: str) -> None:
        try:
            results[arg] = await channel.call(script, [], [arg])
        except DependencyUnavailable as exc:
            results[arg] = str(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, ECHO, "a")
        tg.start_soon(call, FAILS, "b")
        tg.start_soon(call, ECHO, "c")
    assert results == {
        "a": b"a",
        "b": "redis ledger script fails failed: ERR no such key",
        "c": b"c",
    }


async def test_calls_a_broken_connection_left_unanswered_are_sent_once_more() -> None:
    server = FakeServer()
    network = Network(server)
    channel = channel_on(network)
    await channel.call(ECHO, [], ["warm"])
    network.current.reset_after = 0  # the connection resets before answering

    async def one(arg: str, into: list[bytes]) -> None:
        into.append(await channel.call(ECHO, [], [arg]))

    replies: list[bytes] = []
    async with anyio.create_task_group() as tg:
        for arg in ("a", "b", "c"):
            tg.start_soon(one, arg, replies)
    assert sorted(replies) == [b"a", b"b", b"c"]
    assert len(network.transports) == 2
    # At-least-once: what ran before the reset ran again (fenced scripts allow it).
    assert sorted(server.ran) == [b"a", b"a", b"b", b"b", b"c", b"c", b"warm"]


async def test_a_call_is_sent_again_only_once() -> None:
    network = Network(FakeServer())
    channel = channel_on(network)
    await channel.call(ECHO, [], ["warm"])
    network.current.reset_after = 0
    network.reset_new = [0]  # and the next connection too
    with anyio.fail_after(5), pytest.raises(DependencyUnavailable, match="not answered"):
        await channel.call(ECHO, [], ["a"])
    assert await channel.call(ECHO, [], ["b"]) == b"b"  # a third connection


async def test_a_connection_the_server_closed_while_idle_is_opened_again() -> None:
    network = Network(FakeServer())
    channel = channel_on(network)
    await channel.call(ECHO, [], ["a"])
    network.current.server_closes()
    assert await channel.call(ECHO, [], ["b"]) == b"b"
    assert len(network.transports) == 2


async def test_a_refused_connection_fails_the_call_with_one_clear_error() -> None:
    server = FakeServer()
    server.refuse = True
    network = Network(server)
    channel = channel_on(network)
    with pytest.raises(DependencyUnavailable, match=r"redis ledger connection failed: .*refused"):
        await channel.call(ECHO, [], ["a"])
    server.refuse = False
    assert await channel.call(ECHO, [], ["b"]) == b"b"  # the next call connects again


async def test_every_call_queued_behind_a_refused_connection_fails_at_once() -> None:
    server = FakeServer()
    server.refuse = True
    channel = channel_on(Network(server))
    errors: list[str] = []

    async def call(arg: str) -> None:
        try:
            await channel.call(ECHO, [], [arg])
        except DependencyUnavailable as exc:
            errors.append(str(exc))

    with anyio.fail_after(2):  # not retried until a deadline
        async with anyio.create_task_group() as tg:
            for arg in "abc":
                tg.start_soon(call, arg)
    assert len(errors) == 3
    assert all("refused" in error for error in errors)


async def test_an_unanswered_call_times_out_and_the_channel_recovers() -> None:
    server = FakeServer()
    network = Network(server)
    channel = channel_on(network, timeout_s=0.2)
    await channel.call(ECHO, [], ["warm"])
    network.current.frozen = True  # takes commands, never answers (SIGSTOP, a partition)
    with pytest.raises(DependencyUnavailable, match=r"timed out"):
        await channel.call(ECHO, [], ["lost"])
    assert await channel.call(ECHO, [], ["after"]) == b"after"
    assert len(network.transports) == 2  # the stuck connection was dropped, not reused


async def test_a_connection_that_does_not_open_in_time_fails_the_call() -> None:
    network = Network(FakeServer())
    network.connect_gate = anyio.Event()  # never set: the connect hangs
    channel = channel_on(network, timeout_s=0.2)
    with anyio.fail_after(5), pytest.raises(DependencyUnavailable, match=r"timed out"):
        await channel.call(ECHO, [], ["a"])
    network.connect_gate = None
    assert await channel.call(ECHO, [], ["b"]) == b"b"


async def test_a_late_reply_is_dropped_and_never_given_to_a_later_call() -> None:
    server = FakeServer()
    network = Network(server)
    channel = channel_on(network, timeout_s=0.2)
    await channel.call(ECHO, [], ["warm"])
    stuck = network.current
    stuck.held = bytearray()  # the reply is on its way, slowly
    with pytest.raises(DependencyUnavailable, match=r"timed out"):
        await channel.call(ECHO, [], ["late"])
    stuck.closed = False
    stuck.release_held()  # it arrives after all, on the dropped connection
    assert await channel.call(ECHO, [], ["fresh"]) == b"fresh"
    assert await channel.call(OTHER, [], ["next"]) == b"next!"


async def test_a_cancelled_caller_still_gets_the_reply_of_a_call_handed_to_redis() -> None:
    server = FakeServer()
    network = Network(server)
    channel = channel_on(network)
    await channel.call(ECHO, [], ["warm"])
    network.current.held = bytearray()
    got: list[bytes] = []
    others: list[bytes] = []

    async def cancelled_caller(scope: anyio.CancelScope) -> None:
        with scope:
            got.append(await channel.call(ECHO, [], ["mine"]))
            await anyio.lowlevel.checkpoint()  # the cancellation lands here
            got.append(b"not reached")

    async def other_caller() -> None:
        others.append(await channel.call(OTHER, [], ["theirs"]))

    scope = anyio.CancelScope()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancelled_caller, scope)
            tg.start_soon(other_caller)
            await anyio.wait_all_tasks_blocked()
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            assert got == []  # still waiting for its reply, not interrupted
            network.current.release_held()
    assert scope.cancelled_caught
    assert got == [b"mine"]
    assert others == [b"theirs!"]
    assert await channel.call(ECHO, [], ["after"]) == b"after"
    assert server.ran == [b"warm", b"mine", b"theirs", b"after"]


async def test_a_plain_asyncio_cancellation_interrupts_the_call_and_drops_its_reply() -> None:
    """No anyio shield stops a bare ``Task.cancel()``; the channel lets it through
    (as before) and the reply that comes later is dropped, not misdelivered."""
    server = FakeServer()
    network = Network(server)
    channel = channel_on(network)
    await channel.call(ECHO, [], ["warm"])
    network.current.held = bytearray()
    task = asyncio.get_running_loop().create_task(channel.call(ECHO, [], ["gone"]))
    await anyio.wait_all_tasks_blocked()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    network.current.release_held()
    assert await channel.call(OTHER, [], ["next"]) == b"next!"
    assert len(network.transports) == 1


async def test_when_the_caller_opening_the_connection_is_cancelled_another_opens_it() -> None:
    network = Network(FakeServer())
    network.connect_gate = anyio.Event()
    channel = channel_on(network)
    loop = asyncio.get_running_loop()
    opener = loop.create_task(channel.call(ECHO, [], ["first"]))
    await anyio.wait_all_tasks_blocked()  # the first caller is opening, held at the gate
    second = loop.create_task(channel.call(ECHO, [], ["second"]))
    await anyio.wait_all_tasks_blocked()
    opener.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opener
    network.connect_gate.set()
    with anyio.fail_after(2):
        assert await second == b"second"
    assert network.server.ran == [b"second"]


async def test_a_cancelled_caller_can_still_make_a_shielded_call_after_its_reply() -> None:
    """The cancellation comes back at the caller's next checkpoint, as after any
    shielded wait, and so stays out of a shielded clean-up that follows."""
    network = Network(FakeServer())
    channel = channel_on(network)
    await channel.call(ECHO, [], ["warm"])
    network.current.held = bytearray()
    got: list[bytes] = []

    async def caller(scope: anyio.CancelScope) -> None:
        with scope:
            got.append(await channel.call(ECHO, [], ["claim"]))
            with anyio.CancelScope(shield=True):
                got.append(await channel.call(ECHO, [], ["release"]))
            await anyio.lowlevel.checkpoint()
            got.append(b"not reached")

    scope = anyio.CancelScope()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller, scope)
            await anyio.wait_all_tasks_blocked()
            scope.cancel()
            await anyio.wait_all_tasks_blocked()
            network.current.held = None
            network.current.protocol.data_received(b"$5\r\nclaim\r\n")
    assert got == [b"claim", b"release"]
    assert scope.cancelled_caught


async def test_a_caller_told_to_reopen_whose_deadline_passes_first_hands_the_task_on() -> None:
    """The connection breaks and the call's deadline passes in the same loop
    iteration (a loop blocked for a while): the overdue call fails, and the next
    caller opens a connection instead of waiting for one nobody opens."""
    network = Network(FakeServer())
    channel = channel_on(network, timeout_s=0.2)
    await channel.call(ECHO, [], ["warm"])
    network.current.held = bytearray()
    loop = asyncio.get_running_loop()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def overdue() -> None:
                with pytest.raises(DependencyUnavailable, match="timed out"):
                    await channel.call(ECHO, [], ["a"])

            tg.start_soon(overdue)
            await anyio.wait_all_tasks_blocked()
            loop.call_later(0.1, network.current.server_closes)
            time.sleep(0.3)  # noqa: ASYNC251 - blocks the loop on purpose: both come due together
        assert await channel.call(ECHO, [], ["b"]) == b"b"
    assert len(network.transports) == 2
