"""HTTP ingest on a real ``relay start`` worker (embedded broker, real Docker):
a handler posts a follow-up event to ``RELAY_INGEST_URL`` from inside its
container and another function runs it; an operator's ``curl`` gets in with the
secret's token only."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import docker
import pytest

from relay.adapters.fs.secrets import FileSecretStore
from tests.e2e.embedded_support import EmbeddedWorkers

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

SECRET = "ingest-token"
TOKEN = "e2e-operator-token"
EMITTER = """\
runtime: python3.14
events:
  - handler: emit.handler
    pattern:
      kind: [first]
"""
EMIT = """\
import json
import os
import urllib.request


def handler(event):
    body = json.dumps({"event": {"kind": "second", "from": os.environ["RELAY_MESSAGE_ID"]}})
    request = urllib.request.Request(
        os.environ["RELAY_INGEST_URL"], data=body.encode(), method="POST",
        headers={"Authorization": "Bearer " + os.environ["RELAY_INGEST_TOKEN"],
                 "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        print("emitted", answer.status, json.loads(answer.read())["ids"][0], flush=True)
"""
RECEIVER = """\
runtime: python3.14
events:
  - handler: receive.handler
    pattern:
      kind: [second]
"""
RECEIVE = """\
import os


def handler(event):
    print("received from", event["from"], "as", os.environ["RELAY_MESSAGE_ID"], flush=True)
"""


def bridge_gateway() -> str:
    """The default bridge's address on this host: what a container reaches the host at."""
    client = docker.from_env()
    try:
        config = client.networks.get("bridge").attrs["IPAM"]["Config"]
    finally:
        client.close()
    return str(config[0]["Gateway"])


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def write(functions: Path, name: str, template: str, module: str, source: str) -> None:
    (functions / name).mkdir()
    (functions / name / "template.yaml").write_text(template)
    (functions / name / f"{module}.py").write_text(source)


def post(url: str, body: object, token: str) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_a_handler_publishes_a_follow_up_event_that_reaches_another_function(
    embedded_worker: EmbeddedWorkers, functions_dir: Path, tmp_path: Path
) -> None:
    """Row 385: the worker listens on the bridge's gateway address (not loopback:
    a token secret is required); the first handler posts with the token the
    worker gave it, and the second function runs the event it appended."""
    host = bridge_gateway()
    port = free_port(host)
    url = f"http://{host}:{port}"
    write(functions_dir, "ingest-emitter", EMITTER, "emit", EMIT)
    write(functions_dir, "ingest-receiver", RECEIVER, "receive", RECEIVE)
    state = tmp_path / "ingest-state"  # the worker's, with the token's secret set first
    FileSecretStore(state / "secrets").set(SECRET, TOKEN)
    worker = embedded_worker(env={
        "RELAY_STATE_DIR": str(state),
        "INGEST_ADDR": f"{host}:{port}",
        "INGEST_TOKEN_SECRET": SECRET,
        "INGEST_HANDLER_URL": url,
    })
    assert post(f"{url}/v1/events", {"event": {"kind": "first"}}, "wrong")[0] == 401
    status, answer = post(f"{url}/v1/events", {"event": {"kind": "first"}}, TOKEN)
    assert status == 202, answer
    ids = answer["ids"]
    assert isinstance(ids, list)
    [first] = ids
    [emitted] = worker.wait_for(r"emitted 202 ", timeout=180)
    follow_up = emitted.rsplit(" ", 1)[1]
    worker.wait_for(rf"received from {first} as {follow_up}", timeout=180)
    # the token is no part of the container's own environment (docker inspect)
    client = docker.from_env()
    try:
        label = f"relay.hostname={worker.env['RELAY_HOSTNAME']}"
        for container in client.containers.list(filters={"label": label}):
            assert not any(TOKEN in v or "INGEST" in v for v in container.attrs["Config"]["Env"])
    finally:
        client.close()
