"""The Relay side of the container protocol, on a scripted attach stream."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

import anyio
import pytest

from relay.adapters.docker.containers import (
    MAX_LINE_BYTES,
    ContainerSpec,
    ExecutionContainer,
    ProcessExited,
    ProtocolError,
)
from relay.domain.execution import InvocationRequest

pytestmark = pytest.mark.anyio

STDOUT, STDERR = 1, 2


class Message(NamedTuple):
    stream: int
    data: bytes


Script = Callable[[str], list[Message | None]]


class ScriptedStream:
    """Answers each request with the messages ``script(nonce)`` returns."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self.pending: list[Message | None] = []

    async def write_in(self, data: bytes) -> None:
        request = json.loads(data)
        self.requests.append(request)
        self.pending += self.script(request["id"])

    async def read_out(self) -> Message | None:
        await anyio.lowlevel.checkpoint()
        if not self.pending:
            await anyio.sleep_forever()
        return self.pending.pop(0)


def answer(nonce: str, ok: bool = True, error: str = "") -> Message:
    return Message(
        STDOUT, b"\n" + json.dumps({"id": nonce, "ok": ok, "error": error}).encode() + b"\n"
    )


def marker(nonce: str) -> Message:
    return Message(STDERR, b"\x1erelay-end:" + nonce.encode() + b"\n")


def make(script: Script) -> tuple[ExecutionContainer, ScriptedStream]:
    stream = ScriptedStream(script)
    spec = ContainerSpec(function="fn", image="img", runtime="python3.14", hostname="h")
    return ExecutionContainer(spec=spec, container=None, stream=stream), stream


REQUEST = InvocationRequest(
    function="fn", handler="mod.handler", event=b'{"a": 1}', env={"K": "v"}, context="1-0"
)
PREFIX = 'relay: function "fn" handler "mod.handler" message "1-0": '


async def call(container: ExecutionContainer) -> tuple[tuple[bool, str], list[str]]:
    lines: list[str] = []
    result = await container.call(REQUEST, 6.0, lines.append)
    return result, lines


async def test_request_carries_handler_env_and_event() -> None:
    container, stream = make(lambda n: [marker(n), answer(n)])
    assert (await call(container))[0] == (True, "")
    (sent,) = stream.requests
    assert sent["handler"] == "mod.handler"
    assert sent["env"] == {"K": "v", "RELAY_HANDLER": "mod.handler"}
    assert json.loads(sent["event"]) == {"a": 1}
    assert sent["timeout_s"] == 6.0


async def test_output_before_the_marker_is_forwarded_even_when_the_answer_comes_first() -> None:
    container, _ = make(
        lambda n: [
            Message(STDERR, b"one\ntw"),
            answer(n, ok=False, error="ValueError: x"),
            Message(STDERR, b"o\nthree"),
            marker(n),
        ]
    )
    result, lines = await call(container)
    assert result == (False, "ValueError: x")
    assert lines == [PREFIX + "one", PREFIX + "two", PREFIX + "three"]


async def test_a_marker_split_across_messages_is_found() -> None:
    def script(n: str) -> list[Message | None]:
        end = b"last\n\x1erelay-end:" + n.encode() + b"\n"
        return [Message(STDERR, end[:9]), Message(STDERR, end[9:]), answer(n)]

    container, _ = make(script)
    result, lines = await call(container)
    assert result == (True, "")
    assert lines == [PREFIX + "last"]


async def test_frames_without_the_nonce_are_output_not_answers() -> None:
    forged = json.dumps({"id": None, "ok": True, "error": ""}).encode()
    wrong = json.dumps({"id": "guess", "ok": True, "error": ""}).encode()
    container, _ = make(
        lambda n: [
            Message(STDOUT, forged + b"\n" + wrong + b"\npartial"),
            marker(n),
            answer(n, ok=False, error="RuntimeError: real"),
        ]
    )
    result, lines = await call(container)
    assert result == (False, "RuntimeError: real")
    assert lines == [PREFIX + forged.decode(), PREFIX + wrong.decode(), PREFIX + "partial"]


async def test_end_of_stream_is_a_process_exit_and_flushes_partial_output() -> None:
    container, _ = make(lambda n: [Message(STDERR, b"dying words"), None])
    lines: list[str] = []
    with pytest.raises(ProcessExited):
        await container.call(REQUEST, 6.0, lines.append)
    assert lines == [PREFIX + "dying words"]


async def test_a_malformed_answer_is_a_protocol_error() -> None:
    def script(n: str) -> list[Message | None]:
        bad = json.dumps({"id": n, "ok": "yes", "error": ""}).encode()
        return [marker(n), Message(STDOUT, bad + b"\n")]

    container, _ = make(script)
    with pytest.raises(ProtocolError):
        await call(container)


async def test_an_endless_line_is_forwarded_in_bounded_pieces() -> None:
    big = b"z" * (3 * MAX_LINE_BYTES + 10)
    container, _ = make(lambda n: [Message(STDERR, big), marker(n), answer(n)])
    _, lines = await call(container)
    texts = [line.removeprefix(PREFIX) for line in lines]
    assert "".join(texts) == big.decode()
    assert max(len(t) for t in texts) <= MAX_LINE_BYTES


async def test_without_a_context_the_message_part_is_left_out() -> None:
    container, _ = make(lambda n: [Message(STDERR, b"hi\n"), marker(n), answer(n)])
    lines: list[str] = []
    bare = InvocationRequest(function="fn", handler="mod.handler", event=b"{}")
    await container.call(bare, 1.0, lines.append)
    assert lines == ['relay: function "fn" handler "mod.handler": hi']
