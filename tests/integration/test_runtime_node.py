"""The Docker execution runtime with the Node bootstrap, against the real engine."""

from __future__ import annotations

import json
from typing import Any

import pytest

from relay.adapters.docker.attach import READ_LIMIT
from relay.adapters.docker.containers import ContainerSpec, ExecutionContainer, start_container
from relay.adapters.docker.lines import MAX_LINE_BYTES, line_cut
from relay.domain.events import ContainerDiscarded
from tests.integration.runtime_support import (
    BOTH_WAYS,
    assert_ok,
    built_image,
    poll,
    request,
    runtime_for,
    worker_containers,
)
from tests.shared_run import SharedImages
from tests.testbed import DockerEngine

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

NODE = "node24"
FN = "node-fn"


@pytest.fixture(scope="module")
def image(docker_engine: DockerEngine, shared_images: SharedImages) -> str:
    docker_engine.require_image("node:24-alpine")
    return built_image(shared_images, NODE)


async def test_warm_reuse_env_and_output(image: str, unique: str) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        runtime.activate(FN, image, NODE, 1)
        show = ["ONLY_FIRST", "RELAY_HANDLER"]
        assert_ok(
            await runtime.invoke(
                request(FN, "probe.hello", {"show": show}, env={"ONLY_FIRST": "a"}, context="9-0")
            )
        )
        assert_ok(await runtime.invoke(request(FN, "probe.hello", {"show": show})))
        first, second = captured.tagged("HELLO")
        assert (first["count"], second["count"]) == (1, 2)
        assert first["host"] == second["host"]
        assert first["env"] == {"ONLY_FIRST": "a", "RELAY_HANDLER": "probe.hello"}
        assert second["env"]["ONLY_FIRST"] is None
        assert any(
            line.startswith(f'relay: function "{FN}" handler "probe.hello" message "9-0": HELLO ')
            for line in captured.lines
        )
        snap = runtime.snapshot(FN)
        assert snap is not None
        assert (snap.cold_starts, snap.warm_acquires) == (1, 1)
        # the bootstrap connected to Relay's socket: the second request went that way
        (idle,) = runtime._pools[FN].idle
        assert isinstance(idle, ExecutionContainer)
        assert idle.direct is not None
        assert idle.direct.link is not None
        assert idle.direct.link.usable()


async def test_async_and_nested_index_module(image: str, unique: str) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        runtime.activate(FN, image, NODE, 1)
        assert_ok(await runtime.invoke(request(FN, "probe.asyncHello", {"a": 1})))
        assert_ok(await runtime.invoke(request(FN, "events.created.handler", {"n": 5})))
        text = "\n".join(captured.lines)
        assert 'ASYNC {"a":1}' in text
        assert "NESTED 5" in text


@BOTH_WAYS
async def test_failure_keeps_the_container_and_forged_frames_change_nothing(
    image: str, unique: str, direct: bool
) -> None:
    async with runtime_for(f"w-{unique}", direct=direct) as (runtime, captured, _):
        runtime.activate(FN, image, NODE, 1)
        failed = await runtime.invoke(request(FN, "probe.fail"))
        assert not failed.ok
        assert "boom from node" in failed.error
        assert failed.discarded is None
        forged = await runtime.invoke(request(FN, "probe.forgeSuccess"))
        assert not forged.ok
        assert "the real outcome is a failure" in forged.error
        assert sum('"ok":true' in line for line in captured.lines) >= 3
        missing = await runtime.invoke(request(FN, "nothing.here"))
        assert not missing.ok
        assert "no module" in missing.error
        snap = runtime.snapshot(FN)
        assert snap is not None
        assert (snap.cold_starts, snap.discarded) == (1, 0)


async def test_hardening_from_inside(image: str, unique: str) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        runtime.activate(FN, image, NODE, 1)
        assert_ok(await runtime.invoke(request(FN, "probe.facts")))
        (facts,) = captured.tagged("FACTS")
        assert facts["Uid"].split()[0] == "10001"
        assert int(facts["CapEff"], 16) == 0
        assert facts["NoNewPrivs"] == "1"
        assert facts["rootWritable"] is False


async def test_a_blocked_event_loop_times_out_and_is_discarded(image: str, unique: str) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        runtime.activate(FN, image, NODE, 1)
        result = await runtime.invoke(request(FN, "probe.hang", timeout_ns=500_000_000))
        assert result.discarded == "timeout"
        assert [e.reason for e in captured.events if isinstance(e, ContainerDiscarded)] == [
            "timeout"
        ]
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))


async def test_hung_orphan_stops_itself_after_timeout_plus_grace(image: str, unique: str) -> None:
    async with runtime_for(f"w-{unique}") as (_, _, docker):
        spec = ContainerSpec(function=FN, image=image, runtime=NODE, hostname=f"w-{unique}")
        container = await start_container(docker, spec)
        frame = {"id": "n1", "handler": "probe.hang", "env": {}, "event": "{}", "timeout_s": 1}
        await container.stream.write_in(json.dumps(frame).encode() + b"\n")
        # the event loop is blocked; only the watchdog thread can end it
        await poll(lambda: _none_left(docker, f"w-{unique}"), timeout_s=30, what="self-exit")
        await container.stream.close()


async def _none_left(docker: Any, hostname: str) -> bool:
    return not await worker_containers(docker, hostname)


@BOTH_WAYS
async def test_partial_and_endless_lines_do_not_break_the_answer(
    image: str, unique: str, direct: bool
) -> None:
    async with runtime_for(f"w-{unique}", direct=direct) as (runtime, captured, _):
        runtime.activate(FN, image, NODE, 1)
        assert_ok(await runtime.invoke(request(FN, "probe.partialStdout")))
        # fd 1 shares the stderr stream: the partial line runs on into the x's
        head = "no newline here"
        dropped = len(head) + 200000 - MAX_LINE_BYTES
        texts = [line.split('": ', 1)[1] for line in captured.lines]
        assert texts == [head + "x" * (MAX_LINE_BYTES - len(head)) + line_cut(dropped).decode()]


@BOTH_WAYS
@pytest.mark.parametrize("newlines", [False, True], ids=["one-line", "lines"])
async def test_a_flood_before_the_answer_is_read_in_bounded_memory(
    image: str, unique: str, direct: bool, newlines: bool
) -> None:
    # the answer comes on stderr right after the flood: it is still found, and
    # what Relay held stayed bounded
    async with runtime_for(f"w-{unique}", direct=direct) as (runtime, captured, _):
        runtime.activate(FN, image, NODE, 1)
        flood = {"mib": 8, "newlines": newlines}
        assert_ok(await runtime.invoke(request(FN, "probe.flood", flood)))
        texts = [line.split('": ', 1)[1] for line in captured.lines]
        if newlines:
            assert texts == ["f" * 1023] * (8 * 1024) + ["", "FLOODED"]
        else:
            cut = line_cut(8 * 2**20 - MAX_LINE_BYTES).decode()
            assert texts == ["f" * MAX_LINE_BYTES + cut, "FLOODED"]
        (idle,) = runtime._pools[FN].idle  # reach in: the reader's own counters
        assert isinstance(idle, ExecutionContainer)
        assert idle.channel.peak <= READ_LIMIT + 256 * 1024  # one read of the connection
        assert idle.buffered() <= MAX_LINE_BYTES
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
