"""The invocation ledger in Redis: every transition is one fenced Lua script.

Three scripts carry a message from delivery to acknowledgment, so a handled event
costs two ledger round trips (plus its share of one batched ``XREADGROUP``):

- ``begin``: classify once (``HSETNX @class``), claim every eligible invocation
  with the delivery's random token and a deadline on the server clock, and, when
  nothing was claimed, settle the message (DLQ entries, XACK, TTL) right away;
- ``finish``: apply each fenced result (``ok``, backoff, exhausted, or release of
  a claim that never ran), then settle;
- ``malformed``: one placeholder DLQ entry per message (``@dlq``), then XACK.

Settling writes every missing DLQ entry together with its ``:dlq`` marker, then
XACKs and gives the hash a 48 h TTL; a failed DLQ write leaves the message pending.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any, Final

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from relay.adapters.redis.keys import dlq_key, invocation_key, translated
from relay.domain.invocation import Complete, Exhaust, Release, Retry, Transition
from relay.domain.outcome import (
    BeginRequest,
    BeginResult,
    ClaimStatus,
    DeadLettered,
    FinishRequest,
    MalformedRequest,
    MessageContext,
    Settlement,
)

ACKED_TTL_S: Final = 48 * 3600


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class LuaScript:
    """A script run with EVALSHA, loaded (SCRIPT LOAD) on NOSCRIPT, e.g. after a
    Redis restart or SCRIPT FLUSH."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    async def __call__(self, client: Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        with translated(f"ledger script {self.name}"):
            return await self._call(client, keys, args)

    async def _call(self, client: Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await client.script_load(self.source)
            return await client.evalsha(self.sha, len(keys), *keys, *args)


def load_script(name: str) -> LuaScript:
    """``lua/<name>.lua`` with the shared prelude ``lua/common.lua`` prepended."""
    folder = resources.files("relay.adapters.redis").joinpath("lua")
    common = folder.joinpath("common.lua").read_text()
    body = folder.joinpath(f"{name}.lua").read_text()
    return LuaScript(name, common + "\n" + body)


def _transition_args(transition: Transition) -> tuple[str, str]:
    match transition:
        case Complete():
            return "ok", ""
        case Retry(backoff_ms):
            return "retry", str(backoff_ms)
        case Exhaust():
            return "exhaust", ""
        case Release(previous):
            return "release", previous


def _settlement(reply: Sequence[Any], rejected: tuple[str, ...] = ()) -> Settlement:
    acked, written, error = reply
    return Settlement(
        acknowledged=int(acked) == 1,
        dead_lettered=tuple(
            DeadLettered(
                field=_text(w[0]), attempt=int(w[1]), entry_id=_text(w[2]), reason=_text(w[3])
            )
            for w in written
        ),
        dlq_error=_text(error),
        rejected=rejected,
    )


class RedisInvocationLedger:
    """:class:`relay.application.ports.InvocationLedger` on Redis."""

    def __init__(self, client: Redis, *, acked_ttl_s: int = ACKED_TTL_S) -> None:
        self._client = client
        self._ttl = str(acked_ttl_s)
        self._begin = load_script("begin")
        self._finish = load_script("finish")
        self._malformed = load_script("malformed")

    def _head(self, ctx: MessageContext, blocked: bool) -> tuple[list[str], list[str]]:
        keys = [
            invocation_key(ctx.stream, ctx.group, ctx.message_id),
            ctx.stream,
            dlq_key(ctx.stream),
        ]
        args = [ctx.group, ctx.consumer, ctx.message_id, ctx.timestamp, self._ttl]
        args.append("1" if blocked else "0")
        return keys, args

    async def begin(self, request: BeginRequest) -> BeginResult:
        keys, args = self._head(request.context, request.blocked)
        args += [request.classification, request.token, str(len(request.claims))]
        for claim in request.claims:
            args += [claim.field, str(claim.max_attempts), str(claim.lease_ms)]
        args += request.gates
        classified, statuses, settled = await self._begin(self._client, keys, args)
        return BeginResult(
            newly_classified=int(classified) == 1,
            statuses=tuple(
                ClaimStatus(
                    field=_text(s[0]),
                    status=_text(s[1]),
                    attempt=int(s[2]),
                    until_ms=int(_text(s[3])),
                    previous=_text(s[4]),
                    newly=int(s[5]) == 1,
                )
                for s in statuses
            ),
            settlement=_settlement(settled),
        )

    async def finish(self, request: FinishRequest) -> Settlement:
        keys, args = self._head(request.context, request.blocked)
        args += [request.token, str(len(request.reports))]
        for report in request.reports:
            kind, arg = _transition_args(report.transition)
            args += [report.field, str(report.attempt), kind, arg, report.error]
        args += request.gates
        settled, rejected = await self._finish(self._client, keys, args)
        return _settlement(settled, tuple(_text(r) for r in rejected))

    async def dead_letter_malformed(self, request: MalformedRequest) -> Settlement:
        keys, args = self._head(request.context, False)
        args = [*args[:-1], request.reason, request.event]
        return _settlement(await self._malformed(self._client, keys, args))
