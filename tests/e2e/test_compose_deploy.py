"""compose.dev.yaml for real: Relay's own image behind the socket proxy, with Redis.

One stack per module, under a project name of its own, brought up from nothing
(``up --build``) and torn down with ``down -v``; whatever is left after a failure
(the stack's containers, networks, volumes, and handler containers Relay started) is
removed by the fixture. The tests run in file order on that one stack; the last one
tears it down itself and checks that nothing is left.

The embedded (SQLite) broker variant, ``compose.embedded.yaml``, has a stack of its
own in test_compose_embedded.py.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.compose_support import (
    EVENT_JSON,
    PROXY_IMAGE,
    REFUSED,
    ROOT,
    Stack,
    both_handlers_ran,
    proxy_status,
    stack_up,
    wait_for,
)

COMPOSE_FILE = ROOT / "compose.dev.yaml"

# One xdist worker runs both compose modules, one after the other: each builds the same
# relay:latest tag (`up --build`), and its stack is a module fixture that must come up
# once, not once per worker that would otherwise get some of the module's tests.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.docker,
    pytest.mark.timeout(300),
    pytest.mark.xdist_group("compose"),
]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    yield from stack_up(
        COMPOSE_FILE,
        ("redis:7", PROXY_IMAGE, "python:3.14-slim", "ghcr.io/astral-sh/uv:0.12.17"),
    )


def _send_example_event(stack: Stack) -> str:
    reply = stack.exec_in("redis", "redis-cli", "XADD", "events", "*", "event", EVENT_JSON)
    return reply.strip().splitlines()[-1]


def test_relay_behind_the_proxy_becomes_healthy_and_runs_the_example_event(stack: Stack) -> None:
    stack.wait_healthy("relay to report healthy", timeout=180)
    message_id = _send_example_event(stack)
    wait_for(lambda: both_handlers_ran(stack, message_id), "both handlers' output in the log")
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


def test_the_proxy_refuses_everything_outside_the_allow_list(stack: Stack) -> None:
    assert proxy_status(stack, "GET", "/_ping") == 200
    assert proxy_status(stack, "GET", "/v1.41/version") == 200
    for method, path in REFUSED:
        assert proxy_status(stack, method, path) == 403, (method, path)


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
    stack.wait_healthy("relay to report healthy")
    stack.compose("stop", "redis")
    stopped_at = time.monotonic()
    wait_for(lambda: stack.health() == "unhealthy", "relay to report unhealthy", timeout=60)
    # the outage lasts at least ten seconds, as an operator's would
    wait_for(lambda: time.monotonic() - stopped_at >= 10, "ten seconds of outage")
    assert "msg=broker_unavailable" in stack.relay_logs()
    stack.compose("start", "redis")
    stack.wait_healthy("relay to report healthy again", timeout=90)
    # nothing lost: an event sent after the outage is handled (AOF kept the group)
    message_id = _send_example_event(stack)
    wait_for(lambda: both_handlers_ran(stack, message_id), "the handlers after recovery")


def test_a_recreated_relay_container_keeps_its_consumer_name(stack: Stack) -> None:
    stack.compose("up", "-d", "--force-recreate", "--no-deps", "relay")
    stack.wait_healthy("the recreated relay to report healthy")
    consumers = stack.exec_in("redis", "redis-cli", "XINFO", "CONSUMERS", "events", "relay")
    names = [line for line in consumers.splitlines() if line.startswith("relay-")]
    assert names == [stack.hostname], consumers


def test_down_leaves_nothing_behind(stack: Stack) -> None:
    stack.compose("down", "-v", "--timeout", "40")
    assert stack.leftovers() == []
