"""The InvokeFunction use case: ``relay function invoke`` on the live worker.

Runs every event rule of one function whose pattern matches the event, in
declaration order, through the same path as a stream event (concurrency slots,
capped timeout, per-invocation env and secrets, the warm pool) but outside the
delivery lifecycle: no stream, no ledger, no retry, no DLQ, no event counters.
One handler failing does not stop the others; the first failure is reported.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import structlog

from relay.application.bus import Emit, Outcome
from relay.application.environment import resolve_environment
from relay.application.ports import (
    CatalogSource,
    Clock,
    Invoker,
    SecretStore,
    SlotPool,
    TokenSource,
)
from relay.domain.commands import InvokeFunction
from relay.domain.errors import RelayError
from relay.domain.events import HandlerInvoked
from relay.domain.execution import (
    InvocationRequest,
    InvocationResult,
    clamp_timeout_ns,
    crashed,
    failure_message,
)
from relay.domain.handler_context import HandlerContext
from relay.domain.template import EventRule, Template

_log = structlog.get_logger(__name__)

# What one command's answer may carry of its handlers' output and return values
# in all (each handler's output is bounded too): far below the control socket's
# 8 MiB answer bound whatever the number of rules that matched.
INVOKE_SHOWN_BUDGET = 1024 * 1024
INVOKE_CONTEXT = "invoke"  # prefixes the handler's forwarded output lines
# RELAY_MESSAGE_ID of an invoke: never a stream id's shape (<ms>-<seq>), so a
# handler keyed by message id never mistakes it for a delivered message
INVOKE_MESSAGE_PREFIX = "invoke-"


class FunctionNotFound(RelayError):
    """No loaded function has this name."""


class FunctionUnavailable(RelayError):
    """The function exists but has no serving image (never built, or the build failed)."""


class HandlerRun(msgspec.Struct, frozen=True, kw_only=True):
    """What one handler run outside delivery showed: ``relay function invoke``
    (one per handler) and ``relay function run`` print it. ``result`` is the
    return value's JSON text as the bootstrap bounded it (see ``InvocationResult``)."""

    handler: str
    ok: bool
    error: str = ""
    duration_s: float = 0.0
    image: str = ""
    output: tuple[str, ...] = ()
    output_dropped: int = 0
    result: str | None = None
    result_size: int = 0

    @classmethod
    def of(cls, handler: str, result: InvocationResult) -> HandlerRun:
        return cls(
            handler=handler, ok=result.ok, error=result.error, duration_s=result.duration_s,
            image=result.image, output=result.output, output_dropped=result.output_dropped,
            result=result.result, result_size=result.result_size,
        )

    def shown_bytes(self) -> int:
        """About what its output and return value weigh in an answer."""
        return sum(len(line) + 1 for line in self.output) + len(self.result or "")

    def within(self, room: int) -> HandlerRun:
        """Itself, or without output (counted as dropped) and return value past ``room``."""
        if self.shown_bytes() <= room:
            return self
        dropped = self.output_dropped + len(self.output)
        return msgspec.structs.replace(self, output=(), output_dropped=dropped, result=None)


class InvokeSummary(msgspec.Struct, frozen=True, kw_only=True):
    """``invoked`` handlers ran; ``failed`` of them failed; ``error`` is the first
    failure's one line (empty when all succeeded); ``handlers``: each run, in order."""

    invoked: int
    failed: int = 0
    error: str = ""
    handlers: tuple[HandlerRun, ...] = ()


class FunctionInvoker:
    """Handler of :class:`InvokeFunction` (register it on the bus)."""

    def __init__(
        self,
        *,
        registry: CatalogSource,
        runtime: Invoker,
        slots: SlotPool,
        secrets: SecretStore,
        clock: Clock,
        tokens: TokenSource,
        emit: Emit,
    ) -> None:
        self._emit = emit
        self._registry = registry
        self._runtime = runtime
        self._slots = slots
        self._secrets = secrets
        self._clock = clock
        self._tokens = tokens

    async def __call__(self, command: InvokeFunction) -> Outcome[InvokeSummary]:
        name = command.function
        template: Template = serving_function(self._registry, name).template
        now = self._clock.now()
        rules = [rule for rule in template.events if rule.pattern.matches(command.event, now)]
        payload = msgspec.json.encode(command.event)
        events: list[HandlerInvoked] = []
        runs: list[HandlerRun] = []
        shown = 0
        first_error = ""
        # one made-up message per command: its handlers share it, as a message's do
        context = HandlerContext(message_id=INVOKE_MESSAGE_PREFIX + self._tokens.token())
        for rule in rules:
            result = await self._run(name, template, rule, payload, context)
            fact = HandlerInvoked(
                function=name,
                handler=rule.handler,
                ok=result.ok,
                duration_s=result.duration_s,
                error=result.error,
            )
            events.append(fact)
            self._emit(fact)
            runs.append(HandlerRun.of(rule.handler, result).within(INVOKE_SHOWN_BUDGET - shown))
            shown += runs[-1].shown_bytes()
            if not result.ok and not first_error:
                first_error = result.error
        failed = sum(not e.ok for e in events)
        _log.info("function_invoked", function=name, invoked=len(events), failed=failed)
        summary = InvokeSummary(
            invoked=len(events), failed=failed, error=first_error, handlers=tuple(runs)
        )
        return Outcome(summary)

    async def _run(
        self,
        name: str,
        template: Template,
        rule: EventRule,
        payload: bytes,
        context: HandlerContext,
    ) -> InvocationResult:
        started = time.monotonic()
        try:
            return await run_once(
                slots=self._slots,
                runtime=self._runtime,
                secrets=self._secrets,
                template=template,
                request=InvocationRequest(
                    function=name,
                    handler=rule.handler,
                    event=payload,
                    timeout_ns=clamp_timeout_ns(rule.timeout_ns),
                    context=INVOKE_CONTEXT,
                    handler_context=context,
                    capture_output=True,  # the command shows it
                ),
            )
        except RelayError as exc:  # no slot, a missing secret, the runtime refused
            detail = str(exc)
        except Exception as exc:  # noqa: BLE001 - one handler never stops the others
            _log.exception("invoke_crashed", function=name, handler=rule.handler)
            detail = crashed(exc)  # never the repr: it can hold a secret's bytes
        return InvocationResult(
            ok=False,
            error=failure_message(name, rule.handler, detail),
            duration_s=time.monotonic() - started,
        )


def serving_function(registry: CatalogSource, name: str) -> Any:
    """The catalog's ``ActiveFunction`` named ``name``, if it has a serving image.

    Raises :class:`FunctionNotFound` or :class:`FunctionUnavailable` (one line each).
    Shared by the operator actions that run a handler outside delivery.
    """
    function = registry.current().functions.get(name)
    if function is None:
        raise FunctionNotFound(f'function "{name}" not found')
    if function.image is None:
        why = function.last_error or "its first image is still being built"
        raise FunctionUnavailable(f'function "{name}" is not available: {why}')
    return function


async def run_once(
    *,
    slots: SlotPool,
    runtime: Invoker,
    secrets: SecretStore,
    template: Template,
    request: InvocationRequest,
) -> InvocationResult:
    """One handler run outside delivery: the function's concurrency slot, the
    template's env with its secrets resolved now, then the warm runtime.

    ``request.env`` is replaced by the resolved environment. Raises ``RelayError``
    when no slot frees up in time, a secret is missing, or the runtime refuses;
    a handler failure is a result, not an exception.
    """
    async with slots.acquire(request.function):
        env = resolve_environment(template.env, template.secrets, secrets)
        return await runtime.invoke(msgspec.structs.replace(request, env=env))
