"""Ports wrapped to observe deliveries for :class:`~relay.adapters.otel.spans.DeliveryTraces`.

Wired only when tracing is enabled (``bootstrap``): the stream's reads start the
message spans, the ledger's begin and finish calls become the ``relay.claim`` and
``relay.settle`` steps, and the dispatcher's invoker runs each attempt in its
``relay.invocation`` span, handing the handler that span's ``TRACEPARENT``.
Everything else passes through unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec
from opentelemetry.trace import Status, StatusCode

from relay.adapters.otel.spans import DeliveryTraces
from relay.application.ports import EventStream, InvocationLedger, Invoker, StartGuard
from relay.domain.errors import RelayError
from relay.domain.execution import InvocationRequest, InvocationResult
from relay.domain.outcome import (
    CLAIMED,
    BeginRequest,
    BeginResult,
    FinishRequest,
    MalformedRequest,
    Reclaimed,
    RenewRequest,
    Settlement,
    StreamMessage,
)

R = TypeVar("R")


class TracedStream:
    """An :class:`EventStream` whose every delivered message opens its message span."""

    def __init__(self, inner: EventStream, traces: DeliveryTraces) -> None:
        self._inner = inner
        self._traces = traces

    @property
    def stream(self) -> str:
        return self._inner.stream

    @property
    def group(self) -> str:
        return self._inner.group

    @property
    def consumer(self) -> str:
        return self._inner.consumer

    async def ensure_group(self) -> None:
        await self._inner.ensure_group()

    async def read(
        self, count: int, block_ms: int, patience_s: float = 10.0
    ) -> Sequence[StreamMessage]:
        messages = await self._inner.read(count, block_ms, patience_s)
        for message in messages:
            self._traces.read(message, self._inner.stream)
        return messages

    async def reclaim(self, min_idle_ms: int, count: int) -> Reclaimed:
        reclaimed = await self._inner.reclaim(min_idle_ms, count)
        for message in reclaimed.messages:
            self._traces.read(message, self._inner.stream)
        return reclaimed

    async def drop(self, ids: Sequence[str]) -> None:
        await self._inner.drop(ids)


class TracedLedger:
    """An :class:`InvocationLedger` whose begin and finish calls are the claim and
    settle steps of each message they are about."""

    def __init__(self, inner: InvocationLedger, traces: DeliveryTraces) -> None:
        self._inner = inner
        self._traces = traces

    async def begin(self, request: BeginRequest) -> BeginResult:
        call = _one(self._inner.begin(request))
        return (await self._steps("relay.claim", _ids((request,)), call, _claimed))[0]

    async def finish(self, request: FinishRequest) -> Settlement:
        call = _one(self._inner.finish(request))
        return (await self._steps("relay.settle", _ids((request,)), call, _settled))[0]

    async def dead_letter_malformed(self, request: MalformedRequest) -> Settlement:
        call = _one(self._inner.dead_letter_malformed(request))
        return (await self._steps("relay.settle", _ids((request,)), call, _settled))[0]

    async def begin_many(self, requests: Sequence[BeginRequest]) -> list[BeginResult]:
        call = self._inner.begin_many(requests)
        return await self._steps("relay.claim", _ids(requests), call, _claimed)

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[Settlement]:
        call = self._inner.finish_many(requests)
        return await self._steps("relay.settle", _ids(requests), call, _settled)

    async def renew(self, request: RenewRequest) -> int:
        return await self._inner.renew(request)

    async def _steps(
        self,
        name: str,
        ids: Sequence[str],
        call: Awaitable[list[R]],
        describe: Callable[[R], dict[str, Any]],
    ) -> list[R]:
        """One step span per message of one ledger call (they share its timing)."""
        start_ns = time.time_ns()
        try:
            answers = await call
        except Exception as exc:
            # Relay's own errors are one line fit for a log; anything else by its type only
            why = str(exc) if isinstance(exc, RelayError) else type(exc).__name__
            for message_id in ids:
                span = self._traces.step(name, message_id, start_ns)
                if span is not None:
                    span.set_status(Status(StatusCode.ERROR, why))
                    span.end()
            raise
        end_ns = time.time_ns()
        for message_id, answer in zip(ids, answers, strict=True):
            span = self._traces.step(name, message_id, start_ns, **describe(answer))
            if span is not None:
                span.end(end_time=end_ns)
        return answers


async def _one(call: Awaitable[R]) -> list[R]:
    return [await call]


def _ids(requests: Sequence[BeginRequest | FinishRequest | MalformedRequest]) -> list[str]:
    return [r.context.message_id for r in requests]


def _claimed(result: BeginResult) -> dict[str, Any]:
    return {
        "relay.claims": sum(1 for s in result.statuses if s.status == CLAIMED),
        "relay.newly_classified": result.newly_classified,
        "relay.lost": result.lost,
        **_settled(result.settlement),
    }


def _settled(settlement: Settlement) -> dict[str, Any]:
    return {
        "relay.acknowledged": settlement.acknowledged,
        "relay.dead_lettered": len(settlement.dead_lettered),
    }


class TracedInvoker:
    """The dispatcher's :class:`Invoker`: each attempt in its invocation span, the
    handler given that span's context as ``TRACEPARENT``."""

    def __init__(self, inner: Invoker, traces: DeliveryTraces) -> None:
        self._inner = inner
        self._traces = traces

    async def invoke(
        self, request: InvocationRequest, *, guard: StartGuard | None = None
    ) -> InvocationResult:
        traces = self._traces
        invocation, traceparent = traces.start_invocation(request)
        if request.handler_context is not None:
            context = msgspec.structs.replace(request.handler_context, traceparent=traceparent)
            request = msgspec.structs.replace(request, handler_context=context)
        token = traces.enter(invocation)
        try:
            result = await self._inner.invoke(request, guard=guard)
        except BaseException as exc:
            traces.end_invocation(invocation, None, type(exc).__name__)
            raise
        finally:
            traces.leave(token)
        traces.end_invocation(invocation, result)
        return result
