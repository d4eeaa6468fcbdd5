"""The Docker execution runtime against the real engine (Python bootstrap).

Each test uses its own worker hostname, so it only ever sees (and cleans up) its
own execution containers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog

from relay.adapters.docker.containers import ContainerSpec, ExecutionContainer, start_container
from relay.adapters.docker.direct import DirectSocket, DirectSockets
from relay.adapters.docker.lines import MAX_LINE_BYTES, line_cut
from relay.adapters.fs.secrets import FileSecretStore
from relay.application.concurrency import Slots
from relay.application.environment import resolve_environment
from relay.domain.durations import SECOND
from relay.domain.events import ContainerAcquired, ContainerDiscarded
from relay.domain.execution import InvocationResult
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

PY = "python3.14"
FN = "probe-fn"

# The worker runs on uvloop when it is installed, whose transports differ from
# asyncio's: the attach channel is exercised on both.
BOTH_LOOPS = pytest.mark.parametrize(
    "anyio_backend",
    [
        pytest.param("asyncio", id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ],
)


@pytest.fixture(scope="module")
def image(docker_engine: DockerEngine, shared_images: SharedImages) -> str:
    return built_image(shared_images, PY, "ENV APP_VERSION=1")


@pytest.fixture(scope="module")
def image_v2(docker_engine: DockerEngine, shared_images: SharedImages) -> str:
    return built_image(shared_images, PY, "ENV APP_VERSION=2")


def discards(events: list[Any]) -> list[str]:
    return [e.reason for e in events if isinstance(e, ContainerDiscarded)]


async def test_hardening_seen_from_inside_and_outside(
    image: str, unique: str, docker_engine: DockerEngine
) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, docker):
        runtime.activate(FN, image, PY, 1)
        assert_ok(await runtime.invoke(request(FN, "probe.facts")))
        (facts,) = captured.tagged("FACTS")
        assert facts["uid"] == 10001
        assert facts["gid"] == 10001
        assert facts["root_writable"] is False
        assert facts["tmp_writable"] is True
        assert 0 < facts["tmp_bytes"] <= 64 * 1024 * 1024
        assert int(facts["CapEff"], 16) == 0
        assert int(facts["CapPrm"], 16) == 0
        assert facts["NoNewPrivs"] == "1"
        assert facts["memory_limit"] == str(128 * 1024 * 1024)
        assert facts["pids_max"] == "128"
        assert int(facts["cfs_quota"]) == int(facts["cfs_period"])  # one CPU
        assert facts["default_route"] is True  # outbound networking stays on

        (container,) = await worker_containers(docker, f"w-{unique}")
        info = docker_engine.client.api.inspect_container(container.id)
        host = info["HostConfig"]
        assert info["Config"]["User"] == "10001:10001"
        assert host["ReadonlyRootfs"] is True
        assert "/tmp" in host["Tmpfs"]
        assert host["CapDrop"] == ["ALL"]
        assert host["SecurityOpt"] == ["no-new-privileges"]
        assert host["Memory"] == 128 * 1024 * 1024
        assert host["MemorySwap"] == host["Memory"]
        assert host["NanoCpus"] == 1_000_000_000
        assert host["PidsLimit"] == 128
        assert host["AutoRemove"] is True
        assert host["NetworkMode"] == "default"
        labels = info["Config"]["Labels"]
        assert labels["relay.type"] == "execution"
        assert labels["relay.function"] == FN
        assert labels["relay.hostname"] == f"w-{unique}"
        assert labels["relay.image"] == image
        for empty in ("relay.handler", "relay.message_id", "relay.event_id", "relay.event_name"):
            assert labels[empty] == ""


@BOTH_LOOPS
async def test_sequential_invocations_reuse_one_container_and_keep_module_state(
    image: str, unique: str
) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, docker):
        runtime.activate(FN, image, PY, 2)
        for _ in range(3):
            assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        hellos = captured.tagged("HELLO")
        assert [h["count"] for h in hellos] == [1, 2, 3]
        assert len({h["host"] for h in hellos}) == 1
        snap = runtime.snapshot(FN)
        assert snap is not None
        assert (snap.cold_starts, snap.warm_acquires, snap.containers, snap.idle) == (1, 2, 1, 1)
        outcomes = [e.outcome for e in captured.events if isinstance(e, ContainerAcquired)]
        assert outcomes == ["cold", "warm", "warm"]
        assert len(await worker_containers(docker, f"w-{unique}")) == 1


async def test_pool_events_are_observed_at_once_while_another_invocation_runs(
    image: str, unique: str
) -> None:
    # handed over as they happen: never held until the slow invocation ends
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        runtime.activate(FN, image, PY, 2)
        slow_done = anyio.Event()

        async def slow() -> None:
            sleep = request(FN, "probe.sleep", {"s": 5}, timeout_ns=30 * SECOND)
            assert_ok(await runtime.invoke(sleep))
            slow_done.set()

        def acquired() -> list[str]:
            return [e.outcome for e in captured.events if isinstance(e, ContainerAcquired)]

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await poll(lambda: any("SLEEPING" in line for line in captured.lines), what="busy")
            assert_ok(await runtime.invoke(request(FN, "probe.hello")))  # the second, cold
            assert acquired() == ["cold", "cold"]
            assert_ok(await runtime.invoke(request(FN, "probe.hello")))
            assert acquired() == ["cold", "cold", "warm"]
            assert not slow_done.is_set()
        outcomes = acquired()
        assert outcomes[:2] == ["cold", "cold"]
        assert set(outcomes[2:]) == {"warm"}


@BOTH_WAYS
@BOTH_LOOPS
async def test_output_is_forwarded_line_by_line_with_the_prefix(
    image: str, unique: str, direct: bool
) -> None:
    async with runtime_for(f"w-{unique}", direct=direct) as (runtime, captured, _):
        runtime.activate(FN, image, PY, 1)
        assert_ok(
            await runtime.invoke(request(FN, "events.created.handler", {"n": 7}, context="1-0"))
        )
        assert_ok(await runtime.invoke(request(FN, "probe.async_hello", {"a": 1})))
        assert (
            f'relay: function "{FN}" handler "events.created.handler" message "1-0": NESTED 7'
            in (captured.lines)
        )
        assert f'relay: function "{FN}" handler "probe.async_hello": ASYNC {{"a": 1}}' in (
            captured.lines
        )
        assert not any("relay-end" in line for line in captured.lines)


@BOTH_WAYS
async def test_handler_exception_fails_the_invocation_but_keeps_the_container(
    image: str, unique: str, direct: bool
) -> None:
    async with runtime_for(f"w-{unique}", direct=direct) as (runtime, captured, _):
        runtime.activate(FN, image, PY, 1)
        failed = await runtime.invoke(request(FN, "probe.fail"))
        assert not failed.ok
        assert failed.discarded is None
        assert FN in failed.error
        assert "probe.fail" in failed.error
        assert "boom from the handler" in failed.error
        assert any("ValueError: boom from the handler" in line for line in captured.lines)
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        snap = runtime.snapshot(FN)
        assert snap is not None
        assert (snap.cold_starts, snap.discarded) == (1, 0)


async def test_missing_handler_is_a_failure_not_a_crash(image: str, unique: str) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, _, _):
        runtime.activate(FN, image, PY, 1)
        result = await runtime.invoke(request(FN, "nope.handler"))
        assert not result.ok
        assert "nope" in result.error
        assert result.discarded is None


@BOTH_WAYS
async def test_printed_frames_cannot_change_the_result(
    image: str, unique: str, direct: bool
) -> None:
    async with runtime_for(f"w-{unique}", direct=direct) as (runtime, captured, _):
        runtime.activate(FN, image, PY, 1)
        forged = await runtime.invoke(request(FN, "probe.forge_success"))
        assert not forged.ok
        assert "the real outcome is a failure" in forged.error
        assert forged.discarded is None
        # the forged frames reached the output as plain lines
        assert sum('"ok": true' in line for line in captured.lines) >= 4
        honest = await runtime.invoke(request(FN, "probe.forge_failure"))
        assert honest.ok, honest.error
        snap = runtime.snapshot(FN)
        assert snap is not None
        assert snap.cold_starts == 1


async def test_per_invocation_env_is_applied_and_restored(image: str, unique: str) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        runtime.activate(FN, image, PY, 1)
        show = ["ONLY_FIRST", "RELAY_HANDLER", "LEAKED_BY_HANDLER"]
        assert_ok(
            await runtime.invoke(
                request(FN, "probe.set_env", {"show": show}, env={"ONLY_FIRST": "a"})
            )
        )
        assert_ok(await runtime.invoke(request(FN, "probe.hello", {"show": show})))
        first = captured.tagged("ENV")[0]
        second = captured.tagged("HELLO")[0]["env"]
        assert first == {
            "ONLY_FIRST": "a",
            "RELAY_HANDLER": "probe.set_env",
            "LEAKED_BY_HANDLER": "1",
        }
        assert second["ONLY_FIRST"] is None  # removed after the invocation that set it
        assert second["RELAY_HANDLER"] == "probe.hello"


@BOTH_WAYS
@BOTH_LOOPS
async def test_timeout_discards_and_the_next_invocation_gets_a_fresh_container(
    image: str, unique: str, direct: bool
) -> None:
    async with runtime_for(f"w-{unique}", direct=direct) as (runtime, captured, docker):
        runtime.activate(FN, image, PY, 1)
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        (first,) = await worker_containers(docker, f"w-{unique}")
        result = await runtime.invoke(request(FN, "probe.sleep", {"s": 30}, timeout_ns=500_000_000))
        assert not result.ok
        assert result.discarded == "timeout"
        assert "timed out" in result.error
        assert discards(captured.events) == ["timeout"]
        await poll(
            lambda: _gone(docker, f"w-{unique}", first.id), what="the timed-out container to go"
        )
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        hellos = captured.tagged("HELLO")
        assert hellos[0]["host"] != hellos[1]["host"]
        assert hellos[1]["count"] == 1
        snap = runtime.snapshot(FN)
        assert snap is not None
        assert (snap.cold_starts, snap.discarded, snap.containers) == (2, 1, 1)


@BOTH_WAYS
@BOTH_LOOPS
async def test_process_exit_discards_with_its_exit_code(
    image: str, unique: str, direct: bool
) -> None:
    async with runtime_for(f"w-{unique}", direct=direct) as (runtime, captured, _):
        runtime.activate(FN, image, PY, 1)
        result = await runtime.invoke(request(FN, "probe.crash", {"code": 7}))
        assert not result.ok
        assert result.discarded == "process_exit"
        assert "CRASHING" in "\n".join(captured.lines)
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        assert discards(captured.events) == ["process_exit"]
        snap = runtime.snapshot(FN)
        assert snap is not None
        assert snap.cold_starts == 2


async def test_idle_eviction_discards_and_the_next_invocation_starts_cold(
    image: str, unique: str
) -> None:
    async with runtime_for(f"w-{unique}", idle_timeout_s=0.5) as (runtime, captured, docker):
        runtime.activate(FN, image, PY, 1)
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        await poll(lambda: discards(captured.events) == ["idle_timeout"], what="idle eviction")
        await poll(
            lambda: _none_left(docker, f"w-{unique}"), what="the evicted container to be removed"
        )
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        snap = runtime.snapshot(FN)
        assert snap is not None
        assert snap.cold_starts == 2


async def test_image_swap_while_busy_finishes_old_and_serves_next_from_new(
    image: str, image_v2: str, unique: str
) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        runtime.activate(FN, image, PY, 1)
        results: dict[str, InvocationResult] = {}

        async def slow() -> None:
            results["old"] = await runtime.invoke(request(FN, "probe.sleep", {"s": 1.5}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await poll(lambda: any("SLEEPING 1" in line for line in captured.lines), what="busy")
            runtime.activate(FN, image_v2, PY, 1)
            results["new"] = await runtime.invoke(request(FN, "probe.hello"))
        assert_ok(results["old"])
        assert_ok(results["new"])
        assert results["old"].discarded == "image_changed"
        assert captured.tagged("HELLO")[0]["version"] == "2"
        assert any("WOKE 1" in line for line in captured.lines)
        snap = runtime.snapshot(FN)
        assert snap is not None
        assert (snap.containers, snap.cold_starts) == (1, 2)


async def test_concurrency_one_never_runs_two_containers_under_a_burst(
    image: str, unique: str
) -> None:
    hostname = f"w-{unique}"
    async with runtime_for(hostname) as (runtime, _, docker):
        slots = Slots(max_concurrency=8, wait_s=60)
        slots.resize(FN, 1)
        runtime.activate(FN, image, PY, slots.capacity(FN))
        seen: list[int] = []
        done = anyio.Event()

        async def sample() -> None:
            while not done.is_set():
                seen.append(len(await worker_containers(docker, hostname, FN)))
                await anyio.sleep(0.01)

        async def one(index: int) -> None:
            async with slots.acquire(FN):
                assert_ok(await runtime.invoke(request(FN, "probe.hello", {"i": index})))

        async with anyio.create_task_group() as outer:
            outer.start_soon(sample)
            async with anyio.create_task_group() as burst:
                for index in range(40):
                    burst.start_soon(one, index)
            done.set()
        assert max(seen) == 1
        assert len(seen) > 5  # the window was actually observed
        snap = runtime.snapshot(FN)
        assert snap is not None
        assert (snap.cold_starts, snap.warm_acquires) == (1, 39)
        assert slots.waits_total > 0


async def test_rotated_secret_is_seen_by_the_next_invocation_and_never_leaks(
    image: str, unique: str, tmp_path: Path, docker_engine: DockerEngine
) -> None:
    store = FileSecretStore(tmp_path / "secrets")
    canary_1, canary_2 = f"canary-{unique}-one", f"canary-{unique}-two"
    with structlog.testing.capture_logs() as logs:
        async with runtime_for(f"w-{unique}") as (runtime, captured, docker):
            runtime.activate(FN, image, PY, 1)
            digests = []
            for value in (canary_1, canary_2):
                store.set("api-key", value)
                env = resolve_environment({"PLAIN": "x"}, {"API_KEY": "api-key"}, store)
                result = await runtime.invoke(
                    request(FN, "probe.digest", {"var": "API_KEY"}, env=env)
                )
                assert_ok(result)
                digests.append(value)
            (container,) = await worker_containers(docker, f"w-{unique}")
            inspected = json.dumps(docker_engine.client.api.inspect_container(container.id))
    expected = [hashlib.sha256(v.encode()).hexdigest() for v in digests]
    printed = [line.rsplit(" ", 1)[1] for line in captured.lines if "DIGEST" in line]
    assert printed == expected
    snap_text = json.dumps([str(e) for e in captured.events])
    for canary in (canary_1, canary_2):
        assert canary not in inspected  # not in Config.Env, labels or anywhere in inspect
        assert canary not in "\n".join(captured.lines)
        assert canary not in json.dumps(logs, default=str)
        assert canary not in snap_text


@BOTH_LOOPS
async def test_orphaned_container_exits_by_itself_when_relay_goes_away(
    image: str, unique: str
) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, _, docker):
        runtime.activate(FN, image, PY, 1)
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        (idle,) = runtime._pools[FN].idle  # reach in to simulate a killed Relay
        assert isinstance(idle, ExecutionContainer)
        await idle.stream.close()  # the attachment drops, as when Relay dies
        await poll(lambda: _none_left(docker, f"w-{unique}"), what="the orphan to exit")


async def test_hung_orphan_stops_itself_after_timeout_plus_grace(image: str, unique: str) -> None:
    async with runtime_for(f"w-{unique}") as (_, _, docker):
        spec = ContainerSpec(function=FN, image=image, runtime=PY, hostname=f"w-{unique}")
        container = await start_container(docker, spec)
        frame = {
            "id": "n1",
            "handler": "probe.sleep",
            "env": {},
            "event": '{"s": 600}',
            "timeout_s": 1,
        }
        await container.stream.write_in(json.dumps(frame).encode() + b"\n")
        # nobody reads and nobody kills it: the bootstrap's own deadline must
        await poll(lambda: _none_left(docker, f"w-{unique}"), timeout_s=30, what="self-exit")
        await container.stream.close()


async def _gone(docker: Any, hostname: str, container_id: str) -> bool:
    return all(c.id != container_id for c in await worker_containers(docker, hostname))


async def _none_left(docker: Any, hostname: str) -> bool:
    return not await worker_containers(docker, hostname)


async def test_global_bound_retires_the_least_recently_used_idle_container(
    image: str, unique: str
) -> None:
    async with runtime_for(f"w-{unique}", max_containers=2) as (runtime, captured, docker):
        for name in ("fn-a", "fn-b", "fn-c"):
            runtime.activate(name, image, PY, 2)
        assert_ok(await runtime.invoke(request("fn-a", "probe.hello")))
        assert_ok(await runtime.invoke(request("fn-b", "probe.hello")))
        assert_ok(await runtime.invoke(request("fn-c", "probe.hello")))
        assert discards(captured.events) == ["evicted"]
        assert [e.function for e in captured.events if isinstance(e, ContainerDiscarded)] == [
            "fn-a"
        ]
        assert len(await worker_containers(docker, f"w-{unique}")) == 2
        snap_a = runtime.snapshot("fn-a")
        assert snap_a is not None
        assert snap_a.containers == 0


@BOTH_LOOPS
async def test_a_container_that_died_while_idle_is_replaced_without_failing_the_event(
    image: str, unique: str, docker_engine: DockerEngine
) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, docker):
        runtime.activate(FN, image, PY, 1)
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        (container,) = await worker_containers(docker, f"w-{unique}")
        docker_engine.client.api.kill(container.id)
        (idle,) = runtime._pools[FN].idle  # reach in: wait until Relay's side saw it
        assert isinstance(idle, ExecutionContainer)
        await poll(idle.exited, what="the attachment to see the exit")
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        assert discards(captured.events) == ["process_exit"]
        snap = runtime.snapshot(FN)
        assert snap is not None
        assert snap.cold_starts == 2


@BOTH_LOOPS
async def test_an_endless_line_is_cut_at_the_cap_with_a_marker(image: str, unique: str) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        runtime.activate(FN, image, PY, 1)
        assert_ok(await runtime.invoke(request(FN, "probe.long_line")))
        texts = [line.split('": ', 1)[1] for line in captured.lines]
        assert texts == ["y" * MAX_LINE_BYTES + line_cut(200_000 - MAX_LINE_BYTES).decode()]


async def test_a_one_mib_event_and_a_refused_env_name(image: str, unique: str) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, _):
        runtime.activate(FN, image, PY, 1)
        blob = "b" * (1024 * 1024)
        assert_ok(await runtime.invoke(request(FN, "probe.size", {"blob": blob})))
        assert captured.tagged("SIZE") == [{"blob": len(blob)}]
        refused = await runtime.invoke(request(FN, "probe.hello", env={"BAD=NAME": "x"}))
        assert not refused.ok
        assert refused.discarded is None  # a failure, not a dead container
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))


async def test_requests_take_relays_socket_and_its_directory_goes_with_the_container(
    image: str, unique: str
) -> None:
    async with runtime_for(f"w-{unique}", idle_timeout_s=0.5) as (runtime, captured, docker):
        runtime.activate(FN, image, PY, 1)
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        (idle,) = runtime._pools[FN].idle
        assert isinstance(idle, ExecutionContainer)
        assert idle.direct is not None
        link = idle.direct.link
        assert link is not None
        assert link.usable()  # the bootstrap connected: the second request went this way
        directory = idle.direct.directory
        (seen,) = await worker_containers(docker, f"w-{unique}")
        mounts = (await seen.show())["Mounts"]
        assert [(m["Source"], m["Destination"], m["RW"]) for m in mounts] == [
            (str(directory), "/run/relay-channel", False)
        ]
        await poll(lambda: not directory.exists(), what="the evicted container's directory")
        assert runtime.direct is not None
        assert runtime.direct.on
        hellos = captured.tagged("HELLO")
        assert [h["count"] for h in hellos] == [1, 2]


class _Elsewhere(DirectSockets):
    """Sockets whose directory the engine cannot see, as when it runs on another host."""

    async def open(self) -> DirectSocket | None:
        direct = await super().open()
        if direct is not None:
            direct.directory = direct.directory.with_name("elsewhere-" + direct.directory.name)
        return direct


async def test_an_engine_that_cannot_mount_the_directory_gets_attach_only_containers(
    image: str, unique: str
) -> None:
    async with runtime_for(f"w-{unique}") as (runtime, captured, docker):
        assert runtime.direct is not None
        runtime.direct = _Elsewhere(runtime.direct.base)
        runtime.activate(FN, image, PY, 1)
        with structlog.testing.capture_logs() as logs:
            assert_ok(await runtime.invoke(request(FN, "probe.hello")))
            assert_ok(await runtime.invoke(request(FN, "probe.hello")))
        (off,) = [e for e in logs if e["event"] == "direct_socket_off"]
        assert "the engine cannot mount" in off["reason"]
        assert not runtime.direct.on
        (seen,) = await worker_containers(docker, f"w-{unique}")
        assert (await seen.show())["Mounts"] == []
        assert [h["count"] for h in captured.tagged("HELLO")] == [1, 2]
