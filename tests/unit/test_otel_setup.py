"""When tracing is on: the standard endpoint variables and the ``relay[otel]`` extra,
the resource's ``service.name``, and how an export outage is reported."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from structlog.testing import capture_logs

from relay.adapters.otel.export import ReportingExporter
from relay.adapters.otel.setup import start_tracing, tracing_resource, tracing_wanted


def test_either_endpoint_variable_asks_for_traces() -> None:
    assert tracing_wanted({}) is None
    assert tracing_wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}) is None
    assert tracing_wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == (
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    assert tracing_wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}) == (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    disabled = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "True"}
    assert tracing_wanted(disabled) is None


def test_without_the_variable_nothing_is_imported_or_said() -> None:
    with capture_logs() as logs:
        assert start_tracing({}) is None
    assert logs == []


def test_the_variable_without_the_extra_is_one_warning_and_no_tracing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # what an install without relay[otel] sees: the packages cannot be imported
    exporter = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
    for name in (exporter, "opentelemetry.sdk.trace"):
        monkeypatch.setitem(sys.modules, name, None)
    with capture_logs() as logs:
        assert start_tracing({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) is None
    assert [(e["event"], e["log_level"]) for e in logs] == [("tracing_unavailable", "warning")]
    assert logs[0]["reason"] == (
        "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry packages are not"
        " installed: traces are off (install relay[otel])"
    )


def test_with_the_extra_tracing_starts_and_shuts_down() -> None:
    with capture_logs() as logs:
        tracing = start_tracing({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert tracing is not None
    assert [e["event"] for e in logs] == ["tracing_enabled"]
    tracing.shutdown()  # nothing queued: no export is tried


def test_service_name_is_relay_unless_the_standard_variables_name_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert tracing_resource().attributes["service.name"] == "relay"
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "service.name=billing,deployment.environment=prod"
    )
    attributes = tracing_resource().attributes
    assert (attributes["service.name"], attributes["deployment.environment"]) == ("billing", "prod")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "relay-eu")
    assert tracing_resource().attributes["service.name"] == "relay-eu"


class Flaky(SpanExporter):
    """A receiver that answers as ``results`` say (an exception: a broken exporter)."""

    def __init__(self, *results: SpanExportResult | Exception) -> None:
        self.results = list(results)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result


def test_an_export_outage_is_one_warning_and_its_end_one_line() -> None:
    failure, success = SpanExportResult.FAILURE, SpanExportResult.SUCCESS
    exporter = ReportingExporter(Flaky(failure, RuntimeError("bug"), failure, success, success))
    batch = [ReadableSpan(name="x")] * 2
    with capture_logs() as logs:
        results = [exporter.export(batch) for _ in range(5)]
    assert results == [failure, failure, failure, success, success]
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("traces_export_failed", "warning"),
        ("traces_export_recovered", "info"),
    ]
    assert logs[1]["dropped"] == 6
