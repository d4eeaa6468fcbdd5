"""Turning tracing on: the standard OpenTelemetry variables and the ``relay[otel]`` extra.

Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set AND the extra is installed; set
without the extra, one warning line says so and the worker runs untraced. The
SDK reads every other standard variable itself (headers, timeout, the batch
processor's sizes, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``);
``service.name`` is ``relay`` unless one of those names it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, Final

import anyio
import structlog

if TYPE_CHECKING:
    from relay.adapters.brokers import Broker
    from relay.application.ports import Invoker

_log = structlog.get_logger("relay.trace")

ENDPOINT_VARIABLES: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
DEFAULT_SERVICE_NAME: Final = "relay"
SHUTDOWN_BUDGET_S: Final = 15.0  # the exporter's own timeout (10 s by default) bounds it first
MISSING_EXTRA: Final = (
    "is set but the OpenTelemetry packages are not installed: traces are off"
    " (install relay[otel])"
)


def tracing_wanted(environ: Mapping[str, str]) -> str | None:
    """The endpoint variable that asks for traces (None: tracing is off, also when
    the standard ``OTEL_SDK_DISABLED=true`` says so)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    for name in ENDPOINT_VARIABLES:
        if environ.get(name, "").strip():
            return name
    return None


class Tracing:
    """The tracer provider with its batch processor and OTLP/HTTP exporter, and the
    delivery spans built with it; :meth:`shutdown` flushes what is queued."""

    def __init__(self, provider: Any) -> None:
        from relay.adapters.otel.spans import DeliveryTraces

        self.provider = provider
        self.traces = DeliveryTraces(provider.get_tracer("relay"))

    def invoker(self, inner: Invoker) -> Invoker:
        """The dispatcher's invoker: each attempt in its span."""
        from relay.adapters.otel.wrappers import TracedInvoker

        return TracedInvoker(inner, self.traces)

    async def aclose(self) -> None:
        """:meth:`shutdown` off the event loop, shielded and bounded (a receiver that
        is down costs the exporter's timeout at most, never a hung stop)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_BUDGET_S):
            await anyio.to_thread.run_sync(self.shutdown, abandon_on_cancel=True)

    def shutdown(self) -> None:
        """End the spans still open, export what is queued (bounded by the
        exporter's timeout), stop the export thread. Blocking: run in a thread."""
        self.traces.close()
        self.provider.shutdown()


async def open_tracing(stack: AsyncExitStack, broker: Broker) -> Tracing | None:
    """Tracing for ``relay start`` (None: off). The broker's stream and ledger are
    replaced by their traced wrappers; ``stack`` flushes the spans on exit (pushed
    right after the broker opened: it runs once everything started later is
    closed, so in-flight invocations end their spans first)."""
    tracing = start_tracing(os.environ)
    if tracing is None:
        return None
    from relay.adapters.otel.wrappers import TracedLedger, TracedStream

    stack.push_async_callback(tracing.aclose)
    broker.stream = TracedStream(broker.stream, tracing.traces)
    broker.ledger = TracedLedger(broker.ledger, tracing.traces)
    return tracing


def start_tracing(environ: Mapping[str, str]) -> Tracing | None:
    """Tracing as the environment asks, or None (with one warning when it asks
    but the extra is missing)."""
    variable = tracing_wanted(environ)
    if variable is None:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        _log.warning("tracing_unavailable", reason=f"{variable} {MISSING_EXTRA}")
        return None
    from relay.adapters.otel.export import ReportingExporter

    provider = TracerProvider(resource=tracing_resource())
    provider.add_span_processor(BatchSpanProcessor(ReportingExporter(OTLPSpanExporter())))
    _log.info("tracing_enabled", endpoint_variable=variable)
    return Tracing(provider)


def tracing_resource() -> Any:
    """The SDK's resource from the standard variables, named ``relay`` by default."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    name = str(resource.attributes.get(SERVICE_NAME, ""))
    if not name or name.startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource
