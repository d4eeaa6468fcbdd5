from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from relay.adapters.control import client
from relay.adapters.control.lock import ProcessLock
from relay.adapters.control.server import ControlServer
from relay.application.bus import MessageBus
from relay.application.control import ControlHandlers, WorkerHealth
from relay.domain.commands import GetHealth, GetPoolState, ResetStats
from relay.domain.execution import PoolSnapshot

pytestmark = pytest.mark.anyio

POOL = PoolSnapshot(capacity=4, containers=2, busy=1, idle=1, starting=0,
                    warm_acquires=7, cold_starts=3, discarded=2)


class Pools:
    def snapshot(self, function: str) -> PoolSnapshot | None:
        return POOL if function == "fn" else None


class Resets:
    def __init__(self) -> None:
        self.count = 0

    async def reset(self) -> None:
        self.count += 1


def handlers() -> tuple[ControlHandlers, Resets, WorkerHealth]:
    resets, health = Resets(), WorkerHealth()
    return ControlHandlers(pools=Pools(), stats=resets, health=health), resets, health


async def test_handlers_on_the_bus() -> None:
    control, resets, health = handlers()
    bus = MessageBus(control.table())
    assert await bus.send(GetPoolState(function="fn")) == POOL
    assert await bus.send(GetPoolState(function="gone")) is None
    await bus.send(ResetStats())
    assert resets.count == 1
    report = await bus.send(GetHealth())
    assert not report.ready
    assert report.problems == ["worker: still starting"]
    health.mark_started()
    redis_problem: list[str | None] = ["connection refused"]
    health.explain("redis", lambda: redis_problem[0])
    assert (await bus.send(GetHealth())).problems == ["redis: connection refused"]
    redis_problem[0] = None
    assert (await bus.send(GetHealth())).ready
    consumer_up = [False]
    health.watch("consumer", lambda: consumer_up[0])
    assert (await bus.send(GetHealth())).problems == ["consumer: unavailable (retrying)"]
    consumer_up[0] = True
    assert (await bus.send(GetHealth())).ready


async def test_cli_side_reads_the_pool_over_the_socket(tmp_path: Path) -> None:
    control, _, health = handlers()
    health.mark_started()
    with ProcessLock(tmp_path / "r") as lock:
        server = ControlServer(lock, MessageBus(control.table()).send)
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            pool = await anyio.to_thread.run_sync(lambda: client.fetch_pool(server.path, "fn"))
            missing = await anyio.to_thread.run_sync(
                lambda: client.fetch_pool(server.path, "gone")
            )
            health_reply = await anyio.to_thread.run_sync(
                lambda: client.request(server.path, GetHealth())
            )
            tg.cancel_scope.cancel()
    assert pool == {"capacity": 4, "containers": 2, "busy": 1, "idle": 1, "starting": 0,
                    "warm_acquires": 7, "cold_starts": 3, "discarded": 2}
    assert missing is None
    assert health_reply == {"ready": True, "problems": []}


async def test_fetch_health_for_relay_health(tmp_path: Path) -> None:
    assert client.fetch_health(tmp_path / "nothing.sock") is None  # no worker: not a failure
    control, _, health = handlers()
    with ProcessLock(tmp_path / "r") as lock:
        server = ControlServer(lock, MessageBus(control.table()).send)
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            starting = await anyio.to_thread.run_sync(client.fetch_health, server.path)
            health.mark_started()
            ready = await anyio.to_thread.run_sync(client.fetch_health, server.path)
            health.explain("redis", lambda: "connection refused")
            failing = await anyio.to_thread.run_sync(client.fetch_health, server.path)
            tg.cancel_scope.cancel()
    assert starting == "worker not ready: worker: still starting"
    assert ready is None
    assert failing == "worker not ready: redis: connection refused"
