"""The test bed itself: the fixtures of tests/testbed.py against the real engine and Redis."""

from __future__ import annotations

import io
import time

import docker.errors
import pytest
import redis.asyncio
import redis.exceptions

from tests.testbed import (
    REDIS_IMAGE,
    DockerCleanup,
    DockerEngine,
    RedisServer,
    delete_keys_matching,
    new_unique,
    probe_engine,
)

PYTHON_IMAGE = "python:3.14-slim"
NODE_IMAGE = "node:24-alpine"
UV_IMAGE = "ghcr.io/astral-sh/uv:0.12.17"


def test_unreachable_engine_is_reported_in_one_line_naming_the_fix() -> None:
    result = probe_engine("unix:///nonexistent/docker.sock")

    assert isinstance(result, str)
    assert "\n" not in result
    assert "unix:///nonexistent/docker.sock" in result
    assert "scripts/testbed" in result


def test_unique_names_are_short_and_distinct() -> None:
    names = {new_unique() for _ in range(1000)}

    assert len(names) == 1000
    assert all(name.startswith("t-") and len(name) == 10 for name in names)


@pytest.mark.redis
@pytest.mark.anyio
async def test_redis_round_trip(redis_client: redis.asyncio.Redis, unique: str) -> None:
    await redis_client.set(f"{unique}:k", "v")
    entry_id = await redis_client.xadd(f"{unique}:stream", {"event": "{}"})

    assert await redis_client.get(f"{unique}:k") == "v"
    assert await redis_client.xrange(f"{unique}:stream") == [(entry_id, {"event": "{}"})]
    info = await redis_client.info("server")
    assert str(info["redis_version"]).startswith("7.")


@pytest.mark.redis
def test_keys_are_deleted_by_pattern_only(redis_server: RedisServer, unique: str) -> None:
    client = redis.Redis.from_url(redis_server.url)
    other = new_unique()
    try:
        client.set(f"relay:{unique}:a", 1)
        client.set(f"{unique}:b", 1)
        client.set(f"{other}:c", 1)

        assert delete_keys_matching(redis_server.url, f"*{unique}*") == 2
        assert client.exists(f"relay:{unique}:a", f"{unique}:b") == 0
        assert client.exists(f"{other}:c") == 1
    finally:
        client.delete(f"{other}:c")
        client.close()


@pytest.mark.redis
def test_restartable_redis_keeps_its_url_and_loses_its_data(
    restartable_redis: RedisServer, redis_url: str
) -> None:
    url = restartable_redis.url
    client = redis.Redis.from_url(url)
    try:
        client.set("k", "v")
        restartable_redis.restart()

        assert restartable_redis.url == url
        assert url != redis_url
        assert client.ping()  # redis-py reconnects on the next command
        assert client.get("k") is None
    finally:
        client.close()


@pytest.mark.redis
def test_stopped_redis_refuses_connections_until_started(restartable_redis: RedisServer) -> None:
    restartable_redis.stop()
    assert not restartable_redis.ping()

    restartable_redis.start()
    assert restartable_redis.ping()


@pytest.mark.redis
def test_paused_redis_answers_nothing_until_unpaused(restartable_redis: RedisServer) -> None:
    client = redis.Redis.from_url(restartable_redis.url, socket_timeout=0.5)
    try:
        client.set("k", "v")
        restartable_redis.pause()
        try:
            with pytest.raises(redis.exceptions.TimeoutError):
                client.get("k")
        finally:
            restartable_redis.unpause()

        assert client.get("k") == b"v"  # nothing was lost: the server was only frozen
    finally:
        client.close()


@pytest.mark.docker
def test_python_standin_runs_python(
    docker_engine: DockerEngine, docker_cleanup: DockerCleanup
) -> None:
    out = docker_engine.client.containers.run(
        PYTHON_IMAGE, ["python", "-c", "print(1)"], labels=docker_cleanup.labels, remove=True
    )

    assert out == b"1\n"


@pytest.mark.docker
def test_node_standin_runs_node_24_and_npm(
    docker_engine: DockerEngine, docker_cleanup: DockerCleanup
) -> None:
    out = docker_engine.client.containers.run(
        NODE_IMAGE,
        ["sh", "-c", "node -e 'console.log(process.version)' && npm -v"],
        labels=docker_cleanup.labels,
        remove=True,
    )

    node_version, npm_version = out.decode().split()
    assert node_version.startswith("v24.")
    assert npm_version[0].isdigit()


@pytest.mark.docker
def test_uv_image_provides_uv_for_a_multi_stage_build(
    docker_engine: DockerEngine, docker_cleanup: DockerCleanup, unique: str
) -> None:
    dockerfile = f"FROM {PYTHON_IMAGE}\nCOPY --from={UV_IMAGE} /uv /uvx /bin/\n"
    tag = docker_cleanup.image(f"relay-test/{unique}:uv")
    docker_engine.client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()), tag=tag, labels=docker_cleanup.labels, rm=True
    )

    out = docker_engine.client.containers.run(
        tag, ["uv", "--version"], labels=docker_cleanup.labels, remove=True
    )

    assert out.decode().startswith("uv 0.12.17")


@pytest.mark.docker
def test_standins_are_labelled(docker_engine: DockerEngine) -> None:
    for name in (PYTHON_IMAGE, NODE_IMAGE, UV_IMAGE, REDIS_IMAGE):
        labels = docker_engine.client.images.get(name).labels or {}
        assert labels.get("relay.test-standin") == "true", name


@pytest.mark.docker
def test_cleanup_removes_what_the_test_made_and_nothing_else(
    docker_engine: DockerEngine, unique: str
) -> None:
    client = docker_engine.client
    mine = DockerCleanup(client, unique)
    other = DockerCleanup(client, new_unique())
    labelled = client.containers.create(PYTHON_IMAGE, ["true"], labels=mine.labels)
    named = client.containers.create(PYTHON_IMAGE, ["true"], name=f"relay-{unique}-named")
    foreign = client.containers.create(PYTHON_IMAGE, ["true"], labels=other.labels)
    image, _ = client.images.build(
        fileobj=io.BytesIO(f"FROM {PYTHON_IMAGE}\n".encode()),
        tag=f"relay-test/{unique}:img",
        labels=mine.labels,
        rm=True,
    )
    try:
        mine.cleanup()

        for gone in (labelled, named):
            with pytest.raises(docker.errors.NotFound):
                client.containers.get(gone.id)
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(f"relay-test/{unique}:img")
        assert client.containers.get(foreign.id).id == foreign.id
        assert docker_engine.has_image(PYTHON_IMAGE)
    finally:
        other.cleanup()
        image_gone = not docker_engine.has_image(image.id)
    assert image_gone


@pytest.mark.docker
def test_cleanup_tolerates_containers_that_remove_themselves(
    docker_engine: DockerEngine, docker_cleanup: DockerCleanup
) -> None:
    container = docker_engine.client.containers.run(
        PYTHON_IMAGE, ["true"], labels=docker_cleanup.labels, detach=True, auto_remove=True
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            container.reload()
        except docker.errors.NotFound:
            break
        time.sleep(0.05)

    docker_cleanup.container(container.id)  # already gone: cleanup must not fail on it
