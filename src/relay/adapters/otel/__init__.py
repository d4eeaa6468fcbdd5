"""OpenTelemetry traces (the ``relay[otel]`` extra), opt-in by the standard
``OTEL_EXPORTER_OTLP_*ENDPOINT`` variables. Nothing here is imported unless
tracing is enabled: without it no tracing code runs on the hot path."""
