"""A real OTLP/HTTP trace receiver for the test bed: an aiohttp server on a
loopback port of its own (in a thread, beside a worker that runs as a process)
that decodes each ``ExportTraceServiceRequest`` with ``opentelemetry-proto``."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex
    span_id: str  # 16 hex
    parent_span_id: str  # "" for a root
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    resource: dict[str, Any]
    events: tuple[str, ...] = ()


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


@dataclass
class OtlpReceiver:
    """Collects every span exported to ``endpoint`` (the OTEL_EXPORTER_OTLP_ENDPOINT)."""

    port: int = 0
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _export(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        found: list[ReceivedSpan] = []
        for rs in export.resource_spans:
            resource = _attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    found.append(ReceivedSpan(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        attributes=_attributes(s.attributes),
                        status_code=int(s.status.code),
                        resource=resource,
                        events=tuple(e.name for e in s.events),
                    ))
        with self._lock:
            self.requests += 1
            self.spans.extend(found)
        reply = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=reply, content_type="application/x-protobuf")

    def named(self, name: str, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [
                s for s in self.spans
                if s.name == name and (trace_id is None or s.trace_id == trace_id)
            ]

    def wait_for(self, name: str, trace_id: str, timeout: float = 60.0) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.named(name, trace_id)
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no {name} span of trace {trace_id} within {timeout}s: {self.spans}")


@contextmanager
def serve_otlp() -> Iterator[OtlpReceiver]:
    """A receiver listening until the block ends."""
    receiver = OtlpReceiver()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    app = web.Application()
    app.router.add_post("/v1/traces", receiver._export)
    runner = web.AppRunner(app)

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        receiver.port = int(runner.addresses[0][1])
        ready.set()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=serve, name="otlp-receiver", daemon=True)
    thread.start()
    assert ready.wait(10), "the OTLP receiver did not start"
    try:
        yield receiver
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
