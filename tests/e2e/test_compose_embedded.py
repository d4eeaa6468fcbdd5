"""compose.embedded.yaml for real: Relay's own image on the embedded (SQLite) broker.

No Redis: the socket proxy and relay only, the broker file on the ``relay-data``
volume, events published with ``relay publish`` inside the stack. One stack for the
module (compose_support.py), brought up from nothing; the tests run in file order on
it and the last one tears it down and checks that nothing is left.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

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

COMPOSE_FILE = ROOT / "compose.embedded.yaml"
BROKER_FILE = "/var/lib/relay/broker.sqlite3"
MESSAGE_ID = re.compile(r"\d+-\d+")  # the embedded broker's ids: ms-seq, like Redis's

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
        COMPOSE_FILE, (PROXY_IMAGE, "python:3.14-slim", "ghcr.io/astral-sh/uv:0.12.17")
    )


def _ids(reply: str) -> list[str]:
    """The message ids ``relay publish`` printed (compose may add lines of its own)."""
    return [line.strip() for line in reply.splitlines() if MESSAGE_ID.fullmatch(line.strip())]


def test_relay_on_the_embedded_broker_becomes_healthy_and_runs_a_published_event(
    stack: Stack,
) -> None:
    stack.wait_healthy("relay to report healthy", timeout=180)
    services = stack.compose("ps", "--services").split()
    assert sorted(services) == ["relay", "socket-proxy"], services
    relay = stack.container("relay").attrs
    environment = relay["Config"]["Env"]
    assert "RELAY_BROKER=sqlite" in environment
    assert not [e for e in environment if e.startswith("REDIS_URI=")], environment
    (data,) = [m for m in relay["Mounts"] if m["Destination"] == "/var/lib/relay"]
    assert data["Type"] == "volume"
    assert data["Name"] == f"{stack.project}_relay-data"
    (message_id,) = _ids(stack.exec_in("relay", "relay", "publish", "--event", EVENT_JSON))
    wait_for(lambda: both_handlers_ran(stack, message_id), "both handlers' output in the log")
    assert stack.exec_in("relay", "ls", BROKER_FILE).strip() == BROKER_FILE


def test_the_proxy_refuses_everything_outside_the_allow_list(stack: Stack) -> None:
    assert proxy_status(stack, "GET", "/_ping") == 200
    for method, path in REFUSED:
        assert proxy_status(stack, method, path) == 403, (method, path)


def test_events_published_while_relay_is_stopped_are_handled_after_it_restarts(
    stack: Stack,
) -> None:
    """The queue is the file on the volume: it outlives the relay process. Events a
    producer publishes while relay is down wait there and are all handled (lost = 0)."""
    stack.wait_healthy("relay to report healthy")
    stack.compose("stop", "--timeout", "40", "relay")
    assert stack.container("relay").status == "exited"
    # a one-off container of the relay service: the same image, volume and settings
    reply = stack.compose(
        "run", "--rm", "--no-deps", "-T", "relay", "relay", "publish", "--event", EVENT_JSON,
        "--count", "3",
    )
    published = _ids(reply)
    assert len(published) == 3, reply
    stack.compose("start", "relay")
    stack.wait_healthy("the restarted relay to report healthy")

    def unhandled() -> list[str]:
        return [m for m in published if not both_handlers_ran(stack, m)]

    wait_for(lambda: not unhandled(), "both handlers for every event published while stopped")
    dead = stack.exec_in("relay", "relay", "dlq", "ls")
    assert "No dead-lettered entries" in dead, dead


def test_down_leaves_nothing_behind(stack: Stack) -> None:
    stack.compose("down", "-v", "--timeout", "40")
    assert stack.leftovers() == []
