"""One compose stack of Relay's own deployment files, driven the way an operator does.

Shared by the Redis deployment (``compose.dev.yaml``, test_compose_deploy.py) and
the embedded-broker one (``compose.embedded.yaml``, test_compose_embedded.py): each
module brings its stack up from nothing under a project name of its own and tears it
down with ``down -v``; whatever a failure leaves (the stack's containers, networks,
volumes, and handler containers Relay started) is removed by ``remove_everything``.
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
PROXY_IMAGE = "tecnativa/docker-socket-proxy:latest"
EVENT = {
    "event_id": "evt_123",
    "event_name": "INSERT",
    "table_name": "users",
    "new_image": {"id": "user_123", "name": "John Doe", "email": "john@example.com"},
}
EVENT_JSON = json.dumps(EVENT)


def compose_command() -> list[str]:
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
    file: Path
    project: str
    hostname: str
    command: list[str]
    client: Any  # docker.DockerClient

    def compose(self, *args: str, check: bool = True, timeout: float = 240) -> str:
        done = subprocess.run(
            [*self.command, "-p", self.project, "-f", str(self.file), *args],
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

    def wait_healthy(self, what: str, timeout: float = 120.0) -> None:
        """Wait for relay's healthcheck to pass; on timeout, say what it last answered."""
        deadline = time.monotonic() + timeout
        while self.health() != "healthy":
            if time.monotonic() > deadline:
                checks = self.container("relay").attrs["State"].get("Health", {}).get("Log", [])
                last = [str(c.get("Output", "")).strip()[:200] for c in checks[-3:]]
                pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}: {last}")
            time.sleep(0.5)

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


def stack_up(file: Path, images: tuple[str, ...]) -> Iterator[Stack]:
    """The body of a module fixture: ``file`` up from nothing, removed afterwards."""
    client = docker.from_env()
    for image in images:
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            pytest.fail(f"image {image} is missing: run scripts/testbed (as root)", pytrace=False)
    unique = new_unique()
    built = Stack(file, f"relay-e2e-{unique}", f"relay-{unique}", compose_command(), client)
    try:
        built.compose("up", "--build", "-d")
        yield built
    finally:
        try:
            built.remove_everything()
        finally:
            client.close()


def relay_output_for(stack: Stack, message_id: str) -> list[str]:
    return [
        line.split("|", 1)[-1].strip()
        for line in stack.relay_logs().splitlines()
        if f'message "{message_id}"' in line
    ]


def both_handlers_ran(stack: Stack, message_id: str) -> list[str] | None:
    lines = relay_output_for(stack, message_id)
    wanted = (
        'relay: function "user-events-python" handler "events.created.handler" '
        f'message "{message_id}": User created: user_123',
        'relay: function "welcome-email-node" handler "handler.handler" '
        f'message "{message_id}": Sending welcome email to john@example.com',
    )
    return lines if all(w in lines for w in wanted) else None


def proxy_status(stack: Stack, method: str, path: str) -> int:
    """What the proxy answers Relay's container for ``method path``."""
    probe = (
        "import sys, urllib.request, urllib.error\n"
        "r = urllib.request.Request('http://socket-proxy:2375' + sys.argv[2], method=sys.argv[1],"
        " data=b'{}' if sys.argv[1] == 'POST' else None)\n"
        "try:\n    print(urllib.request.urlopen(r, timeout=10).status)\n"
        "except urllib.error.HTTPError as e:\n    print(e.code)\n"
    )
    return int(stack.exec_in("relay", "python3", "-c", probe, method, path).split()[-1])


REFUSED = [
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
]
"""Requests outside the allow-list: the proxy answers each with 403."""
