"""compose.dev.yaml for real: Relay's own image behind the socket proxy, with Redis.

One stack per module, under a project name of its own, brought up from nothing
(``up --build``) and torn down with ``down -v``; whatever is left after a failure
(the stack's containers, networks, volumes, and handler containers Relay started) is
removed by the fixture. The tests run in file order on that one stack; the last one
tears it down itself and checks that nothing is left.

The embedded (SQLite) broker variant, once it lands, belongs in a second stack of its
own below the Redis one (see ``EMBEDDED BROKER`` at the end of this file).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from tests.testbed import new_unique

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.dev.yaml"
PROXY_IMAGE = "tecnativa/docker-socket-proxy:latest"
EVENT = {
    "event_id": "evt_123",
    "event_name": "INSERT",
    "table_name": "users",
    "new_image": {"id": "user_123", "name": "John Doe", "email": "john@example.com"},
}

pytestmark = [pytest.mark.e2e, pytest.mark.docker, pytest.mark.timeout(300)]


def _compose_command() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    if probe.returncode == 0:
        return ["docker", "compose"]
    pytest.fail("no docker-compose: run scripts/testbed (as root) to install it", pytrace=False)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    """Poll ``condition`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


@dataclass
class Stack:
    project: str
    hostname: str
    command: list[str]
    client: Any  # docker.DockerClient

    def compose(self, *args: str, check: bool = True, timeout: float = 240) -> str:
        done = subprocess.run(
            [*self.command, "-p", self.project, "-f", str(COMPOSE_FILE), *args],
            cwd=ROOT,
            env={**_host_env(), "RELAY_HOSTNAME": self.hostname},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            pytest.fail(f"compose {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout + done.stderr

    def container(self, service: str) -> Any:
        found = self.client.containers.list(
            all=True,
            filters={
                "label": [
                    f"com.docker.compose.project={self.project}",
                    f"com.docker.compose.service={service}",
                ]
            },
        )
        assert len(found) == 1, f"{service}: {found}"
        return found[0]

    def health(self) -> str:
        container = self.container("relay")
        container.reload()
        return str(container.attrs["State"].get("Health", {}).get("Status", "none"))

    def relay_logs(self) -> str:
        return self.compose("logs", "--no-color", "relay")

    def exec_in(self, service: str, *argv: str) -> str:
        return self.compose("exec", "-T", service, *argv)

    def leftovers(self) -> list[str]:
        """Everything of this stack still on the engine (and on the host)."""
        label = f"com.docker.compose.project={self.project}"
        found = [
            f"container {c.name}"
            for c in self.client.containers.list(all=True, sparse=True, filters={"label": label})
        ]
        found += [f"network {n.name}" for n in self.client.networks.list(filters={"label": label})]
        found += [f"volume {v.name}" for v in self.client.volumes.list(filters={"label": label})]
        found += [
            f"handler container {c.id[:12]}"
            for c in self.client.containers.list(
                all=True, sparse=True, filters={"label": f"relay.hostname={self.hostname}"}
            )
        ]
        # the shared socket directory is a bind-mount source, which compose never
        # removes; what relay put in it (one directory per warm container) must be gone
        found += [f"socket directory {p}" for p in self.socket_dir.glob("containers/*")]
        return found

    @property
    def socket_dir(self) -> Path:
        return Path("/run/relay-sockets") / self.hostname

    def remove_everything(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "40", check=False)
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        for container in self.client.containers.list(
            all=True, sparse=True, filters={"label": f"relay.hostname={self.hostname}"}
        ):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


def _host_env() -> dict[str, str]:
    # compose needs PATH, HOME and DOCKER_*; nothing of Relay's own configuration
    return {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_"))}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    client = docker.from_env()
    for image in ("redis:7", PROXY_IMAGE, "python:3.14-slim", "ghcr.io/astral-sh/uv:0.12.17"):
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            pytest.fail(f"image {image} is missing: run scripts/testbed (as root)", pytrace=False)
    unique = new_unique()
    built = Stack(f"relay-e2e-{unique}", f"relay-{unique}", _compose_command(), client)
    try:
        built.compose("up", "--build", "-d")
        yield built
    finally:
        try:
            built.remove_everything()
        finally:
            client.close()


def _relay_output_for(stack: Stack, message_id: str) -> list[str]:
    return [
        line.split("|", 1)[-1].strip()
        for line in stack.relay_logs().splitlines()
        if f'message "{message_id}"' in line
    ]


def _send_example_event(stack: Stack) -> str:
    reply = stack.exec_in("redis", "redis-cli", "XADD", "events", "*", "event", json.dumps(EVENT))
    return reply.strip().splitlines()[-1]


def _both_handlers_ran(stack: Stack, message_id: str) -> list[str] | None:
    lines = _relay_output_for(stack, message_id)
    wanted = (
        'relay: function "user-events-python" handler "events.created.handler" '
        f'message "{message_id}": User created: user_123',
        'relay: function "welcome-email-node" handler "handler.handler" '
        f'message "{message_id}": Sending welcome email to john@example.com',
    )
    return lines if all(w in lines for w in wanted) else None


def test_relay_behind_the_proxy_becomes_healthy_and_runs_the_example_event(stack: Stack) -> None:
    wait_for(lambda: stack.health() == "healthy", "relay to report healthy", timeout=180)
    message_id = _send_example_event(stack)
    wait_for(lambda: _both_handlers_ran(stack, message_id), "both handlers' output in the log")
    # acknowledged: nothing pending for the group
    pending = stack.exec_in("redis", "redis-cli", "XPENDING", "events", "relay")
    assert pending.split()[0] == "0", pending


def test_warm_containers_get_their_socket_through_the_shared_directory(stack: Stack) -> None:
    """The fast path behind the proxy: RELAY_DIRECT_DIR is a host directory mounted at
    the same path in relay, so the engine can mount each container's socket directory."""
    shared = f"/run/relay-sockets/{stack.hostname}/containers/"
    # execution containers only: the examples' services run beside them, with no socket
    labels = [f"relay.hostname={stack.hostname}", "relay.type=execution"]
    handlers = stack.client.containers.list(filters={"label": labels})
    assert handlers, "no warm handler containers after the example event"
    for container in handlers:
        sources = [m["Source"] for m in container.attrs["Mounts"]]
        assert [s for s in sources if s.startswith(shared)], (container.name, sources)
    assert "msg=direct_socket_off" not in stack.relay_logs()


def test_the_examples_services_converge_behind_the_proxy(stack: Stack) -> None:
    """Services (issue 20) through the allow-list: the examples' service replicas are
    created, started and labelled by a Relay that only sees the proxy."""
    labels = [f"relay.hostname={stack.hostname}", "relay.type=service"]

    def running() -> list[Any]:
        found = stack.client.containers.list(filters={"label": labels})
        return [c for c in found if c.status == "running"]

    replicas = wait_for(running, "the examples' service replicas to run", timeout=180)
    functions = {c.labels["relay.function"] for c in replicas}
    assert "fastapi-service" in functions, functions
    for container in replicas:
        assert "relay.handler" not in container.labels
        assert not container.attrs["HostConfig"]["PortBindings"]  # nothing published


def _proxy_status(stack: Stack, method: str, path: str) -> int:
    """What the proxy answers Relay's container for ``method path``."""
    probe = (
        "import sys, urllib.request, urllib.error\n"
        "r = urllib.request.Request('http://socket-proxy:2375' + sys.argv[2], method=sys.argv[1],"
        " data=b'{}' if sys.argv[1] == 'POST' else None)\n"
        "try:\n    print(urllib.request.urlopen(r, timeout=10).status)\n"
        "except urllib.error.HTTPError as e:\n    print(e.code)\n"
    )
    return int(stack.exec_in("relay", "python3", "-c", probe, method, path).split()[-1])


def test_the_proxy_refuses_everything_outside_the_allow_list(stack: Stack) -> None:
    assert _proxy_status(stack, "GET", "/_ping") == 200
    assert _proxy_status(stack, "GET", "/v1.41/version") == 200
    for method, path in [
        ("GET", "/v1.41/volumes"),
        ("POST", "/v1.41/volumes/create"),
        # CONTAINERS=1 lets an exec instance be *created* (/containers/{id}/exec, as with
        # the real proxy); running one needs /exec/{id}/start, which stays closed
        ("POST", "/v1.41/exec/x/start"),
        ("GET", "/v1.41/exec/x/json"),
        ("GET", "/v1.41/info"),
        ("GET", "/v1.41/events"),
        ("POST", "/v1.41/swarm/init"),
        ("GET", "/v1.41/secrets"),
    ]:
        assert _proxy_status(stack, method, path) == 403, (method, path)


def test_the_containers_are_hardened_and_nothing_is_published(stack: Stack) -> None:
    relay = stack.container("relay").attrs
    assert relay["Config"]["User"] == "relay:relay"
    assert relay["HostConfig"]["ReadonlyRootfs"] is True
    assert relay["HostConfig"]["CapDrop"] == ["ALL"]
    assert "no-new-privileges:true" in relay["HostConfig"]["SecurityOpt"]
    assert not any("docker.sock" in m["Source"] for m in relay["Mounts"])
    proxy = stack.container("socket-proxy").attrs
    (socket_mount,) = [m for m in proxy["Mounts"] if m["Destination"] == "/var/run/docker.sock"]
    assert socket_mount["RW"] is False
    for service in ("relay", "socket-proxy", "redis"):
        ports = stack.container(service).attrs["NetworkSettings"]["Ports"] or {}
        assert not any(bindings for bindings in ports.values()), (service, ports)
    proxy_networks = proxy["NetworkSettings"]["Networks"]
    assert [name.removeprefix(f"{stack.project}_") for name in proxy_networks] == ["docker-api"]
    assert stack.client.networks.get(f"{stack.project}_docker-api").attrs["Internal"] is True


def test_the_image_reports_the_package_version_and_commit(stack: Stack) -> None:
    image = stack.client.images.get("relay:latest")
    labels = image.labels
    inside = stack.exec_in("relay", "relay", "--version").strip()
    version = labels["org.opencontainers.image.version"]
    commit = labels["org.opencontainers.image.revision"]
    assert inside == (f"relay {version} (commit {commit})" if commit else f"relay {version}")
    host = subprocess.run(
        [str(ROOT / ".venv/bin/relay"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert host.split()[:2] == inside.split()[:2]  # the same package version


def test_health_goes_unhealthy_while_redis_is_down_and_recovers(stack: Stack) -> None:
    wait_for(lambda: stack.health() == "healthy", "relay to report healthy")
    stack.compose("stop", "redis")
    stopped_at = time.monotonic()
    wait_for(lambda: stack.health() == "unhealthy", "relay to report unhealthy", timeout=60)
    # the outage lasts at least ten seconds, as an operator's would
    wait_for(lambda: time.monotonic() - stopped_at >= 10, "ten seconds of outage")
    assert "msg=broker_unavailable" in stack.relay_logs()
    stack.compose("start", "redis")
    wait_for(lambda: stack.health() == "healthy", "relay to report healthy again", timeout=90)
    # nothing lost: an event sent after the outage is handled (AOF kept the group)
    message_id = _send_example_event(stack)
    wait_for(lambda: _both_handlers_ran(stack, message_id), "the handlers after recovery")


def test_a_recreated_relay_container_keeps_its_consumer_name(stack: Stack) -> None:
    stack.compose("up", "-d", "--force-recreate", "--no-deps", "relay")
    wait_for(lambda: stack.health() == "healthy", "the recreated relay to report healthy")
    consumers = stack.exec_in("redis", "redis-cli", "XINFO", "CONSUMERS", "events", "relay")
    names = [line for line in consumers.splitlines() if line.startswith("relay-")]
    assert names == [stack.hostname], consumers


def test_down_leaves_nothing_behind(stack: Stack) -> None:
    stack.compose("down", "-v", "--timeout", "40")
    assert stack.leftovers() == []


# EMBEDDED BROKER: once the SQLite broker lands, add a second module-scoped stack here
# (a compose override without the redis service, relay's REDIS_URI replaced by the
# embedded broker's setting, the events sent through `relay` itself) and run the
# example-event, proxy and teardown checks above against it.
