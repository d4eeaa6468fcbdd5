"""The real test bed as pytest fixtures: the Docker engine, the stand-in images, Redis.

`scripts/testbed` installs and starts everything; these fixtures only use it, and fail with
one line naming that script when something is missing (they never skip silently).

Fixtures (see docs/testing.md):

- ``docker_engine`` (session) -> ``DockerEngine``: ``.client`` (docker SDK), ``.require_image``.
- ``redis_server`` (session) -> ``RedisServer``: one Redis container for the whole run on a
  fixed loopback port; ``.url``, ``.stop()``, ``.start()``, ``.restart()``, ``.kill()``,
  ``.pause()``, ``.unpause()``. Prefer ``restartable_redis`` for tests that break Redis.
- ``redis_url`` (session) -> ``str``: ``redis://127.0.0.1:<port>/0`` of ``redis_server``.
- ``restartable_redis`` (function) -> ``RedisServer``: a private Redis for this test only;
  restarting it keeps its URL; removed after the test.
- ``unique`` (function) -> ``str``: ``t-<8 hex>``, for streams, groups, key prefixes, image
  tags and container names. After the test, keys containing it are deleted from the session
  Redis (SCAN MATCH, never FLUSHALL).
- ``redis_client`` (function) -> ``redis.asyncio.Redis`` on ``redis_url`` with
  ``decode_responses=True``; closed after the test.
- ``docker_cleanup`` (function) -> ``DockerCleanup``: put ``.labels`` on what the test creates
  and/or register names; afterwards containers, networks and test-built images are removed.

Tests marked ``docker``, ``redis`` or ``e2e`` get the engine and the stand-in images checked
before they run.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors
import pytest
import redis
import redis.asyncio
import redis.exceptions

# The reaper image cannot be pulled here; every fixture removes what it started instead.
# Set before testcontainers is imported (it reads its configuration at import time).
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

REDIS_IMAGE = "relay-testbed/redis:7"
STANDIN_IMAGES = (
    "python:3.14-slim",
    "node:24-alpine",
    "ghcr.io/astral-sh/uv:0.12.17",
    REDIS_IMAGE,
)
ENGINE_MARKERS = frozenset({"docker", "redis", "e2e"})
TEST_LABEL = "relay.test"
TEST_ID_LABEL = "relay.test.id"
FIX = "run scripts/testbed (as root) to install and start it"

_ENGINE = pytest.StashKey["DockerEngine | str"]()
_STANDINS_OK = pytest.StashKey[bool]()
_SESSION_REDIS = pytest.StashKey["RedisServer"]()


def new_unique() -> str:
    """A short name no other test (or test run) will produce: ``t-<8 hex>``."""
    return f"t-{secrets.token_hex(4)}"


# --- the engine -----------------------------------------------------------------------


@dataclass
class DockerEngine:
    """A reachable Docker engine."""

    client: Any  # docker.DockerClient (the SDK has no type hints)
    server_version: str
    api_version: str

    def has_image(self, name: str) -> bool:
        try:
            self.client.images.get(name)
        except docker.errors.ImageNotFound:
            return False
        return True

    def require_image(self, name: str) -> None:
        """Fail the test (not skip) when ``name`` is missing locally; nothing can be pulled."""
        if not self.has_image(name):
            pytest.fail(f"image {name} is missing: {FIX}", pytrace=False)


def probe_engine(base_url: str | None = None) -> DockerEngine | str:
    """The engine at ``base_url`` (default: DOCKER_HOST or the local socket), or why not."""
    where = base_url or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if where.startswith("unix://"):
        # Try the socket ourselves first: the SDK leaks its socket when the connect fails.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(where.removeprefix("unix://"))
            except OSError as exc:
                return f"no Docker engine answers at {where} ({exc.strerror}): {FIX}"
    try:
        if base_url is None:
            client = docker.from_env(timeout=30)
        else:
            client = docker.DockerClient(base_url=base_url, timeout=30)
        version = client.version()
    except Exception as exc:  # any failure to reach the engine means the same thing here
        return f"no Docker engine answers at {where} ({type(exc).__name__}): {FIX}"
    return DockerEngine(client, str(version["Version"]), str(version["ApiVersion"]))


def _engine(config: pytest.Config) -> DockerEngine:
    if _ENGINE not in config.stash:
        config.stash[_ENGINE] = probe_engine()
    engine = config.stash[_ENGINE]
    if isinstance(engine, str):
        pytest.fail(engine, pytrace=False)
    return engine


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not any(item.iter_markers(name) for name in ENGINE_MARKERS):
        return
    engine = _engine(item.config)
    if not item.config.stash.get(_STANDINS_OK, False):
        missing = [name for name in STANDIN_IMAGES if not engine.has_image(name)]
        if missing:
            pytest.fail(f"stand-in images missing ({', '.join(missing)}): {FIX}", pytrace=False)
        item.config.stash[_STANDINS_OK] = True


def pytest_sessionfinish(session: pytest.Session) -> None:
    server = session.config.stash.get(_SESSION_REDIS, None)
    if server is not None:
        server.close()
    engine = session.config.stash.get(_ENGINE, None)
    if isinstance(engine, DockerEngine):
        engine.client.close()


@pytest.fixture(scope="session")
def docker_engine(pytestconfig: pytest.Config) -> DockerEngine:
    """The Docker engine; fails (never skips) when it does not answer."""
    return _engine(pytestconfig)


# --- Redis ----------------------------------------------------------------------------


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """A Redis container published on a fixed loopback port, so a restart keeps its URL.

    By default the server keeps nothing on disk: after ``restart()`` (or ``kill()`` +
    ``start()``) it is empty, as a Redis that lost its data would be. With
    ``persistent``, every write is in its append-only file before it is answered, so
    even ``kill()`` + ``start()`` brings back everything it acknowledged.
    """

    def __init__(
        self, engine: DockerEngine, name: str, labels: dict[str, str], *, persistent: bool = False
    ) -> None:
        # Imported here, after TESTCONTAINERS_RYUK_DISABLED is set above, whatever the order
        # in which test modules import things.
        from testcontainers.community.redis import (  # noqa: PLC0415
            PingWaitStrategy,
            RedisContainer,
        )

        class LoopbackRedisContainer(RedisContainer):
            # testcontainers guesses the Docker gateway when /.dockerenv exists; the port is
            # published on loopback only (Redis runs without protected mode inside).
            def get_container_host_ip(self) -> str:
                return "127.0.0.1"

        engine.require_image(REDIS_IMAGE)
        self.host = "127.0.0.1"
        self.port = _free_loopback_port()
        self.name = name
        self._tc = (
            LoopbackRedisContainer(REDIS_IMAGE)
            .with_name(name)
            .with_kwargs(labels=labels)
            .waiting_for(PingWaitStrategy().with_startup_timeout(30))
        )
        if persistent:
            self._tc.with_command(
                "redis-server --port 6379 --bind 0.0.0.0 --protected-mode no --save '' "
                "--appendonly yes --appendfsync always"
            )
        self._tc.ports["6379"] = (self.host, self.port)  # type: ignore[assignment]
        try:
            self._tc.start()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def _container(self) -> Any:
        return self._tc.get_wrapped_container()

    def ping(self) -> bool:
        client = redis.Redis(host=self.host, port=self.port, socket_timeout=1)
        try:
            return bool(client.ping())
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return False
        finally:
            client.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ping():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Redis {self.name} did not answer PING within {timeout} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 2 s); clients see connection errors."""
        self._container.stop(timeout=2)

    def kill(self) -> None:
        """Kill the server at once, as a crash would."""
        self._container.kill()

    def start(self) -> None:
        """Start a stopped server again on the same port and wait until it answers."""
        self._container.start()
        self.wait_ready()

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """Freeze the server: connections stay open but nothing answers (a partition)."""
        self._container.pause()

    def unpause(self) -> None:
        self._container.unpause()

    def close(self) -> None:
        """Remove the container."""
        with contextlib.suppress(docker.errors.NotFound):
            self._tc.stop()


def delete_keys_matching(url: str, pattern: str) -> int:
    """Delete the keys matching ``pattern`` (SCAN MATCH, never FLUSHALL); how many."""
    client = redis.Redis.from_url(url, socket_timeout=5)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += int(client.unlink(*batch))
                batch.clear()
        if batch:
            deleted += int(client.unlink(*batch))
    finally:
        client.close()
    return deleted


@pytest.fixture(scope="session")
def redis_server(pytestconfig: pytest.Config, docker_engine: DockerEngine) -> RedisServer:
    """One Redis for the whole run. Tests that stop or break Redis use ``restartable_redis``."""
    labels = {TEST_LABEL: "true", TEST_ID_LABEL: "session"}
    server = RedisServer(docker_engine, f"relay-test-redis-{new_unique()}", labels)
    pytestconfig.stash[_SESSION_REDIS] = server  # removed in pytest_sessionfinish
    return server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    """``redis://127.0.0.1:<port>/0`` of the session Redis."""
    return redis_server.url


@contextlib.contextmanager
def _own_redis(engine: DockerEngine, unique: str, *, persistent: bool) -> Iterator[RedisServer]:
    labels = {TEST_LABEL: "true", TEST_ID_LABEL: unique}
    server = RedisServer(engine, f"relay-test-redis-{unique}", labels, persistent=persistent)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def restartable_redis(docker_engine: DockerEngine, unique: str) -> Iterator[RedisServer]:
    """A Redis of this test's own: stop/start/restart/kill/pause it freely; URL unchanged."""
    with _own_redis(docker_engine, unique, persistent=False) as server:
        yield server


@pytest.fixture
def persistent_redis(docker_engine: DockerEngine, unique: str) -> Iterator[RedisServer]:
    """As ``restartable_redis``, but what it acknowledged survives ``kill()`` + ``start()``."""
    with _own_redis(docker_engine, unique, persistent=True) as server:
        yield server


@pytest.fixture
def unique(pytestconfig: pytest.Config) -> Iterator[str]:
    """``t-<8 hex>``; afterwards keys containing it are deleted from the session Redis."""
    name = new_unique()
    yield name
    server = pytestconfig.stash.get(_SESSION_REDIS, None)
    if server is not None:
        # If the test stopped the session Redis, its keys are gone with it.
        with contextlib.suppress(redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            delete_keys_matching(server.url, f"*{name}*")


@pytest.fixture
async def redis_client(redis_url: str, unique: str) -> AsyncIterator[redis.asyncio.Redis]:
    """An async client on the session Redis (str replies); name keys with ``unique``."""
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


# --- Docker objects the tests create --------------------------------------------------


@dataclass
class DockerCleanup:
    """What a test created in Docker, removed after it.

    Removed: containers and networks carrying ``labels`` (``relay.test.id=<unique>``) or
    registered by name, containers whose name contains ``unique``; images registered with
    ``image(tag)``, images carrying ``labels``, and tags containing ``unique``. Image removal
    only untags; an image still tagged elsewhere stays. Nothing else is ever touched.
    """

    client: Any
    unique: str
    containers: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)

    @property
    def labels(self) -> dict[str, str]:
        return {TEST_LABEL: "true", TEST_ID_LABEL: self.unique}

    def container(self, name_or_id: str) -> str:
        self.containers.append(name_or_id)
        return name_or_id

    def image(self, tag: str) -> str:
        self.images.append(tag)
        return tag

    def network(self, name_or_id: str) -> str:
        self.networks.append(name_or_id)
        return name_or_id

    def cleanup(self) -> None:
        """Remove everything above; raise if something could not be removed."""
        errors: list[str] = []
        label = f"{TEST_ID_LABEL}={self.unique}"
        # sparse: a full listing inspects each container, and one auto-removed meanwhile
        # (AutoRemove, a worker's own cleanup) would fail the listing with NotFound
        found = self.client.containers.list(all=True, sparse=True, filters={"label": label})
        found += self.client.containers.list(all=True, sparse=True, filters={"name": self.unique})
        ids = {c.id for c in found} | set(self.containers)
        self._remove(ids, lambda ref: self.client.containers.get(ref).remove(force=True), errors)
        nets = {n.id for n in self.client.networks.list(filters={"label": label})}
        nets |= set(self.networks)
        self._remove(nets, lambda ref: self.client.networks.get(ref).remove(), errors)
        self._remove(self._image_refs(label), self.client.images.remove, errors)
        if errors:
            raise RuntimeError(f"docker cleanup for {self.unique} left: {'; '.join(errors)}")

    def _image_refs(self, label: str) -> list[str]:
        # The low-level list: images.list() inspects each image, racing other tests' removals.
        refs = list(self.images)
        for image in self.client.api.images(filters={"label": label}):
            # An untagged image is listed as "<none>:<none>": remove it by id instead.
            tags = [t for t in image.get("RepoTags") or [] if t != "<none>:<none>"]
            refs.extend(tags or [image["Id"]])
        for image in self.client.api.images():
            refs.extend(tag for tag in image.get("RepoTags") or [] if self.unique in tag)
        return list(dict.fromkeys(refs))  # once each, registration order first

    @staticmethod
    def _remove(refs: Any, remove: Callable[[str], None], errors: list[str]) -> None:
        for ref in refs:
            try:
                remove(ref)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code == 409 and "in progress" in str(exc):
                    continue  # AutoRemove is already deleting it
                errors.append(f"{ref}: {exc.explanation or exc}")


@pytest.fixture
def docker_cleanup(docker_engine: DockerEngine, unique: str) -> Iterator[DockerCleanup]:
    """Register (or label) what the test creates; it is all removed after the test."""
    registry = DockerCleanup(docker_engine.client, unique)
    yield registry
    registry.cleanup()
