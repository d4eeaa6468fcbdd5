"""The Relay side of the container protocol, on a scripted attach stream."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from relay.adapters.docker.attach import (
    MAX_FRAME_BYTES,
    READ_LIMIT,
    AttachChannel,
    DeadlinePassed,
)
from relay.adapters.docker.containers import (
    ContainerSpec,
    ExecutionContainer,
    ProcessExited,
    _Nonces,
)
from relay.adapters.docker.lines import MAX_LINE_BYTES, ProtocolError, line_cut
from relay.domain.execution import InvocationRequest
from tests.unit.attach_frames import STDERR, STDOUT, Message, answer, frame, mux

pytestmark = pytest.mark.anyio

Script = Callable[[str], Sequence[Message | OSError | float | None]]


class ScriptedTransport:
    """Answers each request with the messages ``script(nonce)`` returns, each
    delivered to the channel in its own later loop turn (``None``: the
    connection closes; a float: what follows comes that many seconds later).
    With ``chunk`` the bytes arrive cut into pieces of that size, regardless of
    frame boundaries."""

    def __init__(self, script: Script, chunk: int = 0) -> None:
        self.script = script
        self.chunk = chunk
        self.requests: list[dict[str, Any]] = []
        self.channel: AttachChannel | None = None
        self.closing = False
        self.reading = True
        self.held: deque[bytes] = deque()

    def write(self, data: bytes) -> None:
        request = json.loads(data)
        self.requests.append(request)
        loop = asyncio.get_running_loop()
        delay = 0.0
        for message in self.script(request["id"]):
            if isinstance(message, float):
                delay += message  # what follows arrives that much later
                continue
            if message is None or isinstance(message, OSError):
                loop.call_later(delay, self._lose, message)
                continue
            raw = mux(message)
            size = self.chunk or len(raw)
            for start in range(0, len(raw), size):
                loop.call_later(delay, self._deliver, raw[start : start + size])

    def _deliver(self, data: bytes) -> None:
        # as a real transport: nothing is delivered while reading is paused
        if not self.reading or self.held:
            self.held.append(data)
            return
        assert self.channel is not None
        self.channel.data_received(data)

    def _drain(self) -> None:
        if self.reading and self.held:
            assert self.channel is not None
            self.channel.data_received(self.held.popleft())
            asyncio.get_running_loop().call_soon(self._drain)

    def _lose(self, exc: OSError | None) -> None:
        assert self.channel is not None
        self.closing = True
        self.channel.connection_lost(exc)

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True
        asyncio.get_running_loop().call_soon(self._drain)


def make(script: Script, chunk: int = 0) -> tuple[ExecutionContainer, ScriptedTransport]:
    transport = ScriptedTransport(script, chunk)
    channel = transport.channel = AttachChannel(transport)
    spec = ContainerSpec(function="fn", image="img", runtime="python3.14", hostname="h")
    container = ExecutionContainer(spec=spec, container=None, stream=None, channel=channel)
    return container, transport


REQUEST = InvocationRequest(
    function="fn", handler="mod.handler", event=b'{"a": 1}', env={"K": "v"}, context="1-0"
)
PREFIX = 'relay: function "fn" handler "mod.handler" message "1-0": '


async def call(container: ExecutionContainer) -> tuple[tuple[bool, str], list[str]]:
    lines: list[str] = []
    answer = await container.call(REQUEST, 6.0, lines.append)
    return (answer.ok, answer.error), lines


async def test_request_carries_handler_env_and_event() -> None:
    container, stream = make(lambda n: [answer(n)])
    assert (await call(container))[0] == (True, "")
    (sent,) = stream.requests
    assert sent["handler"] == "mod.handler"
    assert sent["env"].pop("RELAY_DEADLINE")  # always set (tests/unit/test_handler_context.py)
    assert sent["env"] == {"K": "v", "RELAY_HANDLER": "mod.handler"}
    assert json.loads(sent["event"]) == {"a": 1}
    assert sent["timeout_s"] == 6.0


async def test_all_output_before_the_answer_is_forwarded_in_order_before_call_returns() -> None:
    # (a): the answer shares the output's stream, so everything printed before it
    # is forwarded, in order, before call() returns; output after it is not this call's
    container, _ = make(
        lambda n: [
            Message(STDERR, b"one\ntw"),
            Message(STDOUT, b"stray on fd 1\n"),
            Message(STDERR, b"o\nthree" + frame(n, ok=False, error="ValueError: x") + b"late\n"),
        ]
    )
    result, lines = await call(container)
    assert result == (False, "ValueError: x")
    assert lines == [PREFIX + "one", PREFIX + "stray on fd 1", PREFIX + "two", PREFIX + "three"]


@pytest.mark.parametrize("cut", [1, 9, 20, 40, -3, -1])
async def test_a_frame_split_across_messages_is_found(cut: int) -> None:
    def script(n: str) -> list[Message | None]:
        end = b"last\n" + frame(n, ok=False, error="E: e")
        return [Message(STDERR, end[:cut]), Message(STDERR, end[cut:])]

    container, _ = make(script)
    result, lines = await call(container)
    assert result == (False, "E: e")
    assert lines == [PREFIX + "last"]


async def test_frames_without_the_nonce_are_output_not_answers() -> None:
    # (b): only the exact marker with this request's nonce, on stderr, is an answer
    forged = json.dumps({"id": None, "ok": True, "error": ""}).encode()
    wrong = b"\x1erelay-end:" + b"0" * 24 + json.dumps({"ok": True, "error": ""}).encode()
    container, stream = make(
        lambda n: [
            Message(STDOUT, forged + b"\n" + wrong + b"\n" + frame(n) + b"partial"),
            Message(STDERR, wrong + b"\n" + forged + b"\n"),
            answer(n, ok=False, error="RuntimeError: real"),
        ]
    )
    result, lines = await call(container)
    assert result == (False, "RuntimeError: real")
    on_stdout = frame(stream.requests[0]["id"]).rstrip(b"\n")
    assert lines == [
        PREFIX + forged.decode(),
        PREFIX + wrong.decode(),
        PREFIX + on_stdout.decode(),
        PREFIX + wrong.decode(),
        PREFIX + forged.decode(),
    ]


async def test_end_of_stream_is_a_process_exit_and_flushes_partial_output() -> None:
    container, _ = make(lambda n: [Message(STDERR, b"dying words"), None])
    lines: list[str] = []
    with pytest.raises(ProcessExited):
        await container.call(REQUEST, 6.0, lines.append)
    assert lines == [PREFIX + "dying words"]


async def test_end_of_stream_inside_the_frame_is_a_process_exit() -> None:
    container, _ = make(lambda n: [Message(STDERR, b"out\n" + frame(n)[:-5]), None])
    lines: list[str] = []
    with pytest.raises(ProcessExited):
        await container.call(REQUEST, 6.0, lines.append)
    assert lines[0] == PREFIX + "out"


@pytest.mark.parametrize(
    "payload", [b'{"ok": "yes", "error": ""}', b"not json", b"[true]", b'{"ok": true}']
)
async def test_a_malformed_answer_is_a_protocol_error(payload: bytes) -> None:
    container, _ = make(
        lambda n: [Message(STDERR, b"\x1erelay-end:" + n.encode() + payload + b"\n")]
    )
    with pytest.raises(ProtocolError):
        await call(container)


async def test_a_frame_that_never_ends_is_a_protocol_error() -> None:
    def script(n: str) -> list[Message | None]:
        head = b"\x1erelay-end:" + n.encode() + b'{"ok": true, "error": "'
        return [Message(STDERR, head), Message(STDERR, b"x" * (MAX_LINE_BYTES + 1))]

    container, _ = make(script)
    with pytest.raises(ProtocolError):
        await call(container)


async def test_a_frame_after_a_partial_line_ends_that_line() -> None:
    container, _ = make(lambda n: [Message(STDERR, b"no newline" + frame(n))])
    result, lines = await call(container)
    assert result == (True, "")
    assert lines == [PREFIX + "no newline"]


async def test_an_endless_line_is_cut_at_the_cap_with_a_marker_saying_how_much() -> None:
    big = b"z" * (3 * MAX_LINE_BYTES + 10)
    container, _ = make(lambda n: [Message(STDERR, big), Message(STDERR, b"\nnext\n"), answer(n)])
    _, lines = await call(container)
    dropped = 2 * MAX_LINE_BYTES + 10
    assert lines == [
        PREFIX + "z" * MAX_LINE_BYTES + line_cut(dropped).decode(),
        PREFIX + "next",
    ]


@pytest.mark.parametrize("stream", [STDOUT, STDERR])
@pytest.mark.parametrize("newlines", [False, True], ids=["one-line", "lines"])
async def test_a_flood_is_held_in_bounded_memory_and_the_answer_still_counts(
    stream: int, newlines: bool
) -> None:
    # 8 MiB in engine-sized frames: what Relay holds never grows past the read
    # limit plus one frame, and one line's cap, whatever the newlines
    piece = (b"f" * 1023 + b"\n") if newlines else b"f" * 1024
    flood = Message(stream, piece * 32)
    container, transport = make(lambda n: [*[flood] * 256, answer(n, ok=False, error="E: done")])
    result, lines = await call(container)
    assert result == (False, "E: done")
    assert container.channel.peak <= READ_LIMIT + len(mux(flood))
    assert container.buffered() <= MAX_LINE_BYTES
    assert not transport.held  # everything was read
    if newlines:
        assert lines == [PREFIX + "f" * 1023] * (8 * 1024)
    elif stream == STDERR:  # the answer ends the line it interrupts
        cut = line_cut(8 * 2**20 - MAX_LINE_BYTES).decode()
        assert lines == [PREFIX + "f" * MAX_LINE_BYTES + cut]
    else:  # stdout has no answer in it: the line goes on in the next call
        assert lines == []
        assert container.buffered() == MAX_LINE_BYTES


async def test_what_looks_like_the_start_of_a_marker_at_a_cut_stays_output() -> None:
    container, _ = make(
        lambda n: [
            Message(STDERR, b"a\x1erelay-e"),
            Message(STDERR, b"nd:not-the-nonce\n\x1e"),
            Message(STDERR, b"\x1e\n" + frame(n)),
        ]
    )
    result, lines = await call(container)
    assert result == (True, "")
    assert lines == [PREFIX + "a\x1erelay-end:not-the-nonce", PREFIX + "\x1e\x1e"]


async def test_without_a_context_the_message_part_is_left_out() -> None:
    container, _ = make(lambda n: [Message(STDERR, b"hi\n"), answer(n)])
    lines: list[str] = []
    bare = InvocationRequest(function="fn", handler="mod.handler", event=b"{}")
    await container.call(bare, 1.0, lines.append)
    assert lines == ['relay: function "fn" handler "mod.handler": hi']


# --- the attach channel: framing, deadline, flow control, end of connection ---------
@pytest.mark.parametrize("chunk", [1, 3, 8, 11])
async def test_frames_cut_anywhere_by_the_connection_read_the_same(chunk: int) -> None:
    container, _ = make(
        lambda n: [
            Message(STDERR, b"one\ntw"),
            Message(STDOUT, b"stray on fd 1\n"),
            Message(STDERR, b"o\nthree" + frame(n, ok=False, error="ValueError: x")),
        ],
        chunk=chunk,
    )
    result, lines = await call(container)
    assert result == (False, "ValueError: x")
    assert lines == [PREFIX + "one", PREFIX + "stray on fd 1", PREFIX + "two", PREFIX + "three"]


async def test_no_answer_before_the_deadline_raises_deadline_passed() -> None:
    container, _ = make(lambda n: [Message(STDERR, b"working...\n")])
    lines: list[str] = []
    with pytest.raises(DeadlinePassed):
        await container.call(REQUEST, 0.05, lines.append)
    assert lines == [PREFIX + "working..."]


async def test_output_after_the_answer_is_kept_for_the_next_call() -> None:
    container, _ = make(lambda n: [Message(STDERR, frame(n) + b"background\n")])
    assert (await call(container)) == ((True, ""), [])
    result, lines = await call(container)
    assert result == (True, "")
    assert lines == [PREFIX + "background"]


async def test_reading_pauses_past_the_limit_and_resumes_once_read() -> None:
    noise = Message(STDOUT, b"x" * 1000 + b"\n")
    chatter = [noise] * (READ_LIMIT // 1000 + 2)
    container, transport = make(lambda n: [*chatter, answer(n)])
    channel = container.channel
    channel.data_received(b"".join(mux(m) for m in chatter))  # printed while idle
    assert not transport.reading
    result, lines = await call(container)
    assert result == (True, "")
    assert transport.reading
    assert len(lines) == 2 * len(chatter)


async def test_a_frame_longer_than_the_read_limit_is_read_to_its_end() -> None:
    # reading pauses past the limit; a frame that is not whole yet must resume
    # it, or the call waits for bytes that can never come
    big = Message(STDERR, b"g" * (3 * READ_LIMIT) + b"\n")
    container, _ = make(lambda n: [big, answer(n)], chunk=16 * 1024)
    lines: list[str] = []
    answered = await container.call(REQUEST, 2.0, lines.append)
    assert (answered.ok, answered.error) == (True, "")
    assert lines == [PREFIX + "g" * MAX_LINE_BYTES + line_cut(2 * READ_LIMIT).decode()]
    assert container.channel.peak <= len(mux(big)) + 16 * 1024


async def test_a_frame_declared_larger_than_any_engine_sends_is_a_protocol_error() -> None:
    header = bytes([STDERR, 0, 0, 0]) + (MAX_FRAME_BYTES + 1).to_bytes(4, "big")
    container, _ = make(lambda n: [])
    container.channel.data_received(header + b"x" * 100)
    with pytest.raises(ProtocolError, match="a frame of 1048577 bytes"):
        await call(container)


async def test_a_closed_attachment_refuses_the_request_as_a_process_exit() -> None:
    container, transport = make(lambda n: [answer(n)])
    container.channel.connection_lost(None)
    assert container.exited()
    with pytest.raises(ProcessExited):
        await call(container)
    assert transport.requests == []


async def test_a_broken_connection_ends_the_call_like_an_exit() -> None:
    # as through aiodocker: the runtime then asks the engine for the exit code
    container, _ = make(lambda n: [Message(STDERR, b"half"), OSError("reset by peer")])
    lines: list[str] = []
    with pytest.raises(ProcessExited):
        await container.call(REQUEST, 6.0, lines.append)
    assert lines == [PREFIX + "half"]
    assert isinstance(container.channel.error, OSError)


class Original:
    def __init__(self) -> None:
        self.lost: list[Exception | None] = []

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


async def test_the_end_of_the_connection_reaches_aiohttps_protocol_too() -> None:
    original = Original()
    channel = AttachChannel(ScriptedTransport(lambda n: []), original)
    assert channel.eof_received() is False
    channel.connection_lost(None)
    assert original.lost == [None]
    assert channel.closed


async def test_a_deadline_left_from_an_earlier_request_does_not_cut_a_later_one_short() -> None:
    # one timer serves successive requests: the first request's (0.05 s) fires
    # while the second (6 s) still waits for its answer, and must re-arm instead
    container, _ = make(lambda n: [0.2, answer(n)])
    lines: list[str] = []
    container.channel.arm(0.05)
    container.channel.disarm()  # the first request, answered at once
    answered = await container.call(REQUEST, 6.0, lines.append)
    assert (answered.ok, answered.error) == (True, "")


async def test_a_shorter_deadline_than_the_pending_timer_still_fires() -> None:
    container, _ = make(lambda n: [])
    container.channel.arm(60.0)
    container.channel.disarm()
    lines: list[str] = []
    with pytest.raises(DeadlinePassed):
        await container.call(REQUEST, 0.05, lines.append)


async def test_the_end_of_the_connection_stops_the_deadline_timer() -> None:
    container, _ = make(lambda n: [answer(n)])
    await call(container)
    assert container.channel._timer is not None  # kept for the next request
    container.channel.connection_lost(None)
    assert container.channel._timer is None


def test_request_ids_are_unique_hex_across_batches() -> None:
    nonces = _Nonces()
    drawn = [nonces.next() for _ in range(3 * _Nonces.BATCH + 1)]
    assert len(set(drawn)) == len(drawn)
    assert all(len(n) == 2 * _Nonces.SIZE and int(n, 16) >= 0 for n in drawn)
