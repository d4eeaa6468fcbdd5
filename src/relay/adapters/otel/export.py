"""The OTLP exporter as Relay reports it: an outage is one warning line, not the
SDK's line per retry of every batch.

A receiver that is down (or refuses spans) costs the spans of the batches it did
not take, nothing else: delivery never waits for an export (the batch processor
exports from its own thread). The first failed export after a good one logs
``traces_export_failed``; the first good one after failures logs
``traces_export_recovered`` with how many spans were dropped meanwhile. The
SDK exporter's own loggers are quieted (to errors it cannot report through
its result: none we know of), since this wrapper says the same in Relay's format.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import structlog
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

_log = structlog.get_logger("relay.trace")


class ReportingExporter(SpanExporter):
    """Wraps the real exporter; its failures become one line per outage."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner
        self._failing = False
        self.dropped = 0
        logging.getLogger("opentelemetry.exporter").setLevel(logging.CRITICAL)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
            error = "" if result is SpanExportResult.SUCCESS else "the receiver did not take them"
        except Exception as exc:  # noqa: BLE001 - an exporter bug must not stop the export thread
            result, error = SpanExportResult.FAILURE, type(exc).__name__
        if error:
            self.dropped += len(spans)
            if not self._failing:
                self._failing = True
                _log.warning(
                    "traces_export_failed",
                    spans=len(spans),
                    error=error,
                    effect="spans dropped until the receiver answers; delivery is unaffected",
                )
        elif self._failing:
            self._failing = False
            _log.info("traces_export_recovered", dropped=self.dropped)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)
