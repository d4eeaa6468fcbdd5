"""A real handler floods the channels from its container to Relay: what Relay
holds stays bounded, the flood fails or is cut with a marker, and the function
keeps serving (Python bootstrap, both ways a request can travel)."""

from __future__ import annotations

import pytest

from relay.adapters.docker.attach import READ_LIMIT
from relay.adapters.docker.containers import ExecutionContainer
from relay.adapters.docker.direct import MAX_PENDING_BYTES
from relay.adapters.docker.lines import MAX_LINE_BYTES, line_cut
from relay.domain.events import ContainerDiscarded
from tests.integration.runtime_support import (
    BOTH_WAYS,
    assert_ok,
    built_image,
    request,
    runtime_for,
)
from tests.shared_run import SharedImages
from tests.testbed import DockerEngine

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

PY = "python3.14"
FN = "flood-fn"
MIB = 16
# the most one read of the connection delivers (asyncio's and uvloop's transports)
ONE_READ = 256 * 1024


@pytest.fixture(scope="module")
def image(docker_engine: DockerEngine, shared_images: SharedImages) -> str:
    return built_image(shared_images, PY)


def the_idle_container(runtime: object) -> ExecutionContainer:
    (idle,) = runtime._pools[FN].idle  # type: ignore[attr-defined] # reach in: its buffers
    assert isinstance(idle, ExecutionContainer)
    return idle


@BOTH_WAYS
@pytest.mark.parametrize("newlines", [False, True], ids=["one-line", "lines"])
async def test_a_handler_flooding_its_output_is_read_in_bounded_memory(
    image: str, unique: str, direct: bool, newlines: bool
) -> None:
    async with runtime_for(f"w-{unique}", direct=direct) as (runtime, captured, _):
        runtime.activate(FN, image, PY, 1)
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        container = the_idle_container(runtime)
        captured.lines.clear()
        flood = await runtime.invoke(request(FN, "probe.flood", {"mib": MIB, "newlines": newlines}))
        assert_ok(flood)
        texts = [line.split('": ', 1)[1] for line in captured.lines]
        if newlines:
            assert texts == ["f" * 1023] * (MIB * 1024) + ["", "FLOODED"]
        else:
            cut = line_cut(MIB * 2**20 - MAX_LINE_BYTES).decode()
            assert texts == ["f" * MAX_LINE_BYTES + cut, "FLOODED"]
        assert container.channel.peak <= READ_LIMIT + ONE_READ
        assert container.buffered() <= MAX_LINE_BYTES
        # the same warm container serves the next invocation
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        assert the_idle_container(runtime) is container
        assert not [e for e in captured.events if isinstance(e, ContainerDiscarded)]


async def test_a_handler_flooding_relays_socket_fails_in_one_line_and_the_next_one_works(
    image: str, unique: str
) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        runtime.activate(FN, image, PY, 1)
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        container = the_idle_container(runtime)
        assert container.direct is not None
        link = container.direct.link
        assert link is not None
        flooded = await runtime.invoke(request(FN, "probe.flood_socket", {"mib": MIB}))
        assert not flooded.ok
        # one line, whichever Relay saw first: a line that is no answer, or too much
        assert flooded.error in (
            f'function "{FN}" handler "probe.flood_socket": protocol error: the socket '
            f"carried {what}"
            for what in (
                f"more than {MAX_PENDING_BYTES} bytes that are not an answer",
                "something that is not this request's answer",
            )
        )
        assert flooded.discarded == "protocol_error"
        assert len(link.buffer) == 0
        assert link.peak <= MAX_PENDING_BYTES
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        assert [h["count"] for h in captured.tagged("HELLO")] == [1, 1]  # a fresh container
