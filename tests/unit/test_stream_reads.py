"""BlockingReads on an in-memory connection: replies, broken and refused
connections, cancelled reads.

The fake sits where the reads meet the network: an opener that attaches the
protocol to a fake transport. Each connection follows a script of what happens
to the commands written on it (answer, drop the connection, never answer).
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import hiredis
import pytest

from relay.adapters.redis.stream import BlockingReads
from relay.adapters.takeover import TakenOver
from relay.domain.errors import DependencyUnavailable
from tests.fakes import ClosingTransport

pytestmark = pytest.mark.anyio

COMMAND = b"*1\r\n$4\r\nPING\r\n"


class FakeTransport(ClosingTransport):
    def __init__(self, protocol: TakenOver, plan: list[str]) -> None:
        super().__init__(protocol)
        self.plan = plan  # per command: "answer", "error", "drop", "silent", "garbage"
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        step = self.plan.pop(0) if self.plan else "answer"
        if step == "answer":
            self.loop.call_soon(self.protocol.data_received, b"+PONG\r\n")
        elif step == "error":
            self.loop.call_soon(self.protocol.data_received, b"-NOGROUP no such group\r\n")
        elif step == "garbage":
            self.loop.call_soon(self.protocol.data_received, b"?what\r\n")
        elif step == "drop":
            self.close()


class Opener:
    """Opens connections that follow ``plans`` in turn; ``refuse`` fails the open."""

    def __init__(self, *plans: list[str]) -> None:
        self.plans = list(plans)
        self.opened: list[FakeTransport] = []
        self.refuse = False

    async def __call__(self, protocol: TakenOver) -> None:
        await anyio.lowlevel.checkpoint()
        if self.refuse:
            raise ConnectionRefusedError("Connection refused")
        transport = FakeTransport(protocol, self.plans.pop(0) if self.plans else [])
        self.opened.append(transport)
        protocol.connection_made(transport)


async def test_a_reply_comes_back_and_the_connection_is_kept() -> None:
    opener = Opener()
    reads = BlockingReads(opener)
    assert await reads.call(COMMAND) == b"PONG"
    assert await reads.call(COMMAND) == b"PONG"
    assert len(opener.opened) == 1


async def test_an_error_reply_is_returned_for_the_caller_to_read() -> None:
    reads = BlockingReads(Opener(["error"]))
    reply: Any = await reads.call(COMMAND)
    assert isinstance(reply, hiredis.ReplyError)
    assert str(reply).startswith("NOGROUP")


async def test_a_broken_connection_is_opened_again_and_the_command_sent_once_more() -> None:
    opener = Opener(["drop"], ["answer"])
    reads = BlockingReads(opener)
    assert await reads.call(COMMAND) == b"PONG"
    assert [len(t.writes) for t in opener.opened] == [1, 1]


async def test_a_connection_the_server_closed_while_idle_is_replaced_before_use() -> None:
    opener = Opener()
    reads = BlockingReads(opener)
    await reads.call(COMMAND)
    opener.opened[0].close()  # a Redis restart between two reads
    await anyio.wait_all_tasks_blocked()
    assert await reads.call(COMMAND) == b"PONG"
    assert [len(t.writes) for t in opener.opened] == [1, 1]


async def test_a_connection_already_closing_is_not_written_to() -> None:
    opener = Opener()
    reads = BlockingReads(opener)
    await reads.call(COMMAND)
    opener.opened[0].close()  # closing; its connection_lost is still on its way
    assert await reads.call(COMMAND) == b"PONG"
    assert [len(t.writes) for t in opener.opened] == [1, 1]


async def test_broken_twice_fails_with_one_clear_line() -> None:
    opener = Opener(["drop"], ["drop"], ["answer"])
    reads = BlockingReads(opener)
    with pytest.raises(DependencyUnavailable, match=r"^redis XREADGROUP failed: "):
        await reads.call(COMMAND)
    assert len(opener.opened) == 2  # sent once more, never a third time
    assert await reads.call(COMMAND) == b"PONG"  # and the next read starts afresh


async def test_a_refused_connection_fails_at_once() -> None:
    opener = Opener()
    opener.refuse = True
    reads = BlockingReads(opener)
    with pytest.raises(DependencyUnavailable, match="cannot connect: Connection refused"):
        await reads.call(COMMAND)
    assert opener.opened == []


async def test_a_reply_that_is_not_resp_breaks_the_connection() -> None:
    opener = Opener(["garbage"], ["answer"])
    reads = BlockingReads(opener)
    assert await reads.call(COMMAND) == b"PONG"
    assert opener.opened[0].closed


async def test_a_cancelled_read_closes_its_connection_and_the_next_opens_another() -> None:
    opener = Opener(["silent"], ["answer"])
    reads = BlockingReads(opener)
    with anyio.move_on_after(0.01) as scope:
        await reads.call(COMMAND)
    assert scope.cancelled_caught
    assert opener.opened[0].closed  # its late reply can never be taken for the next one's
    assert await reads.call(COMMAND) == b"PONG"
    assert len(opener.opened) == 2


async def test_a_read_past_its_deadline_fails_and_closes_its_connection() -> None:
    opener = Opener(["silent"], ["answer"])
    reads = BlockingReads(opener)
    with pytest.raises(TimeoutError):
        await reads.call(COMMAND, anyio.current_time() + 0.02)
    assert opener.opened[0].closed  # a late reply must not answer the next read
    assert await reads.call(COMMAND, anyio.current_time() + 5) == b"PONG"
    assert len(opener.opened) == 2


async def test_a_connection_that_never_opens_fails_by_the_deadline() -> None:
    class Silent(Opener):
        async def __call__(self, protocol: TakenOver) -> None:
            await anyio.sleep_forever()

    reads = BlockingReads(Silent())
    with pytest.raises(DependencyUnavailable, match="cannot connect: no answer in time"):
        await reads.call(COMMAND, anyio.current_time() + 0.02)
