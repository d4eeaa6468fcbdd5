"""The three shipped handler examples, served by the real ``relay start``.

The spec's example event reaches both the Python and the Node example; an
``order.created`` event reaches the TypeScript example, bundled at build time.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import EXAMPLES, copy_function, send_event, wait_until

pytestmark = pytest.mark.e2e

EXAMPLE_EVENT = {
    "event_id": "evt_123",
    "event_name": "INSERT",
    "table_name": "users",
    "new_image": {"id": "user_123", "name": "John Doe", "email": "john@example.com"},
}
ORDER_EVENT = {
    "type": "order.created",
    "order_id": "ord_42",
    "customer": {"name": "Ada", "email": "ada@example.com"},
    "lines": [
        {"sku": "book", "quantity": 2, "unit_price": 12.5},
        {"sku": "pen", "quantity": 1, "unit_price": 1.25},
    ],
}


def handler_line(function: str, handler: str, message_id: str, text: str) -> str:
    return (
        rf'^relay: function "{function}" handler "{handler}" '
        rf'message "{re.escape(message_id)}": {re.escape(text)}$'
    )


def test_the_examples_serve_their_events(
    relay_worker: WorkerFactory,
    functions_dir: Path,
    worker_env: dict[str, str],
    sync_redis: redis.Redis,
) -> None:
    for name in ("user-events-python", "welcome-email-node", "order-confirmation-typescript"):
        copy_function(EXAMPLES / name, functions_dir)
    worker = relay_worker()
    stream, group = worker_env["REDIS_STREAM"], worker_env["REDIS_GROUP"]

    user = send_event(sync_redis, stream, EXAMPLE_EVENT)
    order = send_event(sync_redis, stream, ORDER_EVENT)

    worker.wait_for(
        handler_line("user-events-python", "events.created.handler", user, "User created: user_123")
    )
    worker.wait_for(
        handler_line(
            "welcome-email-node",
            "handler.handler",
            user,
            "Sending welcome email to john@example.com",
        )
    )
    worker.wait_for(
        handler_line(
            "order-confirmation-typescript",
            "src.handler.handler",
            order,
            "Order ord_42 confirmed for ada@example.com: 2 item(s), total 26.25",
        )
    )

    def acked() -> bool:
        rows = sync_redis.xpending_range(stream, group, min="-", max="+", count=10)
        return not rows

    wait_until(acked, 30, "both messages to be acknowledged")
    assert not worker.find(r'handler "events\.(updated|deleted)\.handler"')
    # Each warm container (Python, Node, TypeScript) got a socket of the
    # worker's; a second event goes that way, output first as ever.
    sockets = sorted((worker.run_dir / "containers").iterdir())
    assert len(sockets) == 3
    assert all((directory / "relay.sock").is_socket() for directory in sockets)
    again = send_event(sync_redis, stream, {**EXAMPLE_EVENT, "event_id": "evt_124"})
    worker.wait_for(
        handler_line(
            "user-events-python", "events.created.handler", again, "User created: user_123"
        )
    )
    worker.wait_for(
        handler_line(
            "welcome-email-node",
            "handler.handler",
            again,
            "Sending welcome email to john@example.com",
        )
    )
    wait_until(acked, 30, "the second event to be acknowledged")
    assert not worker.find("direct_socket_off")
    assert worker.stop() == 0
    assert list((worker.run_dir / "containers").iterdir()) == []
