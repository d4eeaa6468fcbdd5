"""Traces end to end: a real ``relay start`` worker (relay[otel] installed) exports
to a real OTLP/HTTP receiver; one event published with ``relay publish
--traceparent`` yields its message and invocation spans under the producer's
trace, parented correctly, and the handler sees the invocation's TRACEPARENT."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import WorkerFactory
from tests.e2e.embedded_support import EmbeddedWorkers, admin_env, broker_rows
from tests.e2e.failure_support import free_port
from tests.e2e.harness import RelayWorker, run_relay, wait_until
from tests.otlp_receiver import OtlpReceiver, serve_otlp

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PRODUCER_SPAN}-01"
FUNCTION = "otel-traced"  # one source for every test here: one image, never retired under another
TEMPLATE = """\
runtime: python3.14
events:
  - handler: jobs.show.handler
    pattern:
      kind: [traced]
"""
HANDLER = """\
import os


def handler(event):
    print("traceparent " + os.environ.get("TRACEPARENT", "none"), flush=True)
"""


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    with serve_otlp() as receiver:
        yield receiver


def write_function(functions: Path) -> None:
    fn = functions / FUNCTION
    (fn / "jobs").mkdir(parents=True)
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "jobs" / "show.py").write_text(HANDLER)


def tracing_env(endpoint: str) -> dict[str, str]:
    # a short batch delay: the spans go out at once, not after the default 5 s
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}


def publish_traced(env: dict[str, str]) -> str:
    done = run_relay(
        ["publish", "--event", '{"kind": "traced"}', "--traceparent", TRACEPARENT],
        env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def handler_saw(worker: RelayWorker) -> str:
    [line] = worker.wait_for(r"jobs\.show\.handler.*: traceparent ", timeout=120)
    return line.rsplit("traceparent ", 1)[1].strip()


def assert_one_traced_delivery(receiver: OtlpReceiver, message_id: str, seen: str) -> None:
    [message] = receiver.wait_for("relay.message", TRACE)
    [invocation] = receiver.wait_for("relay.invocation", TRACE)
    assert message.parent_span_id == PRODUCER_SPAN  # under the producer's span
    assert message.attributes["relay.message_id"] == message_id
    assert message.attributes["relay.outcome"] == "completed"
    assert message.resource["service.name"] == "relay"
    assert invocation.parent_span_id == message.span_id
    assert invocation.attributes["relay.function"] == FUNCTION
    assert invocation.attributes["relay.handler"] == "jobs.show.handler"
    assert invocation.attributes["relay.attempt"] == 1
    assert invocation.attributes["relay.outcome"] == "success"
    # the handler's own spans would join under its invocation span
    assert seen == f"00-{TRACE}-{invocation.span_id}-01"
    for step in ("relay.claim", "relay.settle"):
        [span] = receiver.wait_for(step, TRACE)
        assert span.parent_span_id == message.span_id
    for child in ("relay.container.acquire", "relay.handler"):
        [span] = receiver.wait_for(child, TRACE)
        assert span.parent_span_id == invocation.span_id


def test_an_event_with_a_traceparent_is_traced_on_the_embedded_broker(
    embedded_worker: EmbeddedWorkers, functions_dir: Path, otlp_receiver: OtlpReceiver
) -> None:
    write_function(functions_dir)
    worker = embedded_worker(env=tracing_env(otlp_receiver.endpoint))
    message_id = publish_traced(admin_env(worker))
    assert_one_traced_delivery(otlp_receiver, message_id, handler_saw(worker))


@pytest.mark.redis
def test_an_event_with_a_traceparent_is_traced_on_redis(
    relay_worker: WorkerFactory, functions_dir: Path, otlp_receiver: OtlpReceiver
) -> None:
    write_function(functions_dir)
    worker = relay_worker(env=tracing_env(otlp_receiver.endpoint))
    message_id = publish_traced(worker.admin_env)
    assert_one_traced_delivery(otlp_receiver, message_id, handler_saw(worker))


def test_an_untraced_worker_passes_the_producers_traceparent_to_the_handler(
    embedded_worker: EmbeddedWorkers, functions_dir: Path
) -> None:
    write_function(functions_dir)
    worker = embedded_worker()  # no OTEL_* variable: tracing is off
    publish_traced(admin_env(worker))
    assert handler_saw(worker) == TRACEPARENT
    assert worker.find("tracing_") == []


def test_a_receiver_that_is_down_drops_spans_and_delivery_goes_on(
    embedded_worker: EmbeddedWorkers, functions_dir: Path, broker_file: Path
) -> None:
    """Row 320: nothing listens at the endpoint: every export fails (one warning
    line), the event is still handled and acknowledged, and the worker still stops
    cleanly (the export's retries are bounded by its timeout)."""
    write_function(functions_dir)
    # a short export timeout (seconds in this SDK) also bounds the retries at the stop
    env = {**tracing_env(f"http://127.0.0.1:{free_port()}"), "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
    worker = embedded_worker(env=env)
    publish_traced(admin_env(worker))
    seen = handler_saw(worker)
    # the invocation span's context: in the producer's trace, not its span
    assert seen.startswith(f"00-{TRACE}-")
    assert not seen.endswith(f"{PRODUCER_SPAN}-01")
    wait_until(
        lambda: broker_rows(broker_file, "SELECT state FROM jobs") == [("acked",)],
        60,
        "the event acknowledged",
    )
    assert worker.stop(timeout=30) == 0
    # the outage is one line in Relay's format, not the SDK's line per retry
    assert len(worker.find(r"level=WARN msg=traces_export_failed ")) == 1
    assert worker.find("Transient error") == []
