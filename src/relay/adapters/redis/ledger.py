"""The invocation ledger in Redis: every transition is one fenced Lua script.

The scripts carry out :mod:`relay.domain.ledger_rules` (the one specification;
a property test runs both on the same random cases). Three carry a message from
delivery to acknowledgment; the worker sends them batched (``begin_many`` for a
read batch, ``finish_many`` for a settle group, below), so a handled event costs
a share of two script calls and of one ``XREADGROUP``:

- ``begin``: classify once (``HSETNX @class``), claim every eligible invocation
  with the delivery's random token and a deadline on the server clock, and, when
  nothing was claimed, settle the message (DLQ entries, XACK, TTL) right away;
- ``finish``: apply each fenced result (``ok``, backoff, exhausted, or release of
  a claim that never ran), then settle;
- ``malformed``: one placeholder DLQ entry per message (``@dlq``), then XACK;
- ``renew`` (rare): extend a claim whose lease would not cover its handler's
  timeout after a slow container start;
- ``begin_many`` / ``finish_many``: ``begin`` / ``finish`` for every message of a
  batch in one script call (the batched core's path: one call claims a read
  batch, one settles a group). Both loop the same Lua functions as the single
  calls (``begin_step`` / ``finish_step`` in ``lua/common.lua``).

Settling writes every missing DLQ entry together with its ``:dlq`` marker, then
XACKs and gives the hash a TTL (``LEDGER_RETENTION``, 48 h by default); a failed DLQ
write leaves the message pending.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, Final

from redis.asyncio import Redis

from relay.adapters.redis.keys import dlq_key, invocation_key
from relay.adapters.redis.scripts import LuaScript, ScriptChannel
from relay.adapters.redis.takeover import dedicated_connection
from relay.domain.invocation import (
    LEDGER_RETENTION_S,
    Complete,
    Exhaust,
    Release,
    Retry,
    Transition,
)
from relay.domain.ledger_rules import lua_constants
from relay.domain.outcome import (
    BeginRequest,
    BeginResult,
    ClaimStatus,
    DeadLettered,
    FinishRequest,
    MalformedRequest,
    MessageContext,
    RenewRequest,
    Settlement,
)

ACKED_TTL_S: Final = LEDGER_RETENTION_S


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _lua_string(text: str) -> str:
    """``text`` as a Lua string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def constants_source() -> str:
    """The Lua ``local`` lines every script starts with: the domain's constants."""
    return "".join(
        f"local {key} = {_lua_string(value)}\n" for key, value in lua_constants().items()
    )


def script_source(name: str) -> str:
    """The source of ``lua/<name>.lua``: the constants of the domain's rules (reason
    texts, reserved names: defined once, in :mod:`relay.domain.ledger_rules`), the
    shared prelude ``lua/common.lua``, then the script."""
    folder = resources.files("relay.adapters.redis").joinpath("lua")
    constants = constants_source()
    common = folder.joinpath("common.lua").read_text()
    body = folder.joinpath(f"{name}.lua").read_text()
    return constants + common + "\n" + body


def load_script(name: str) -> LuaScript:
    """The script ``name`` (see :func:`script_source`)."""
    return LuaScript(name, script_source(name))


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


def _begun(reply: Sequence[Any]) -> BeginResult:
    classified, statuses, settled, unplanned = reply
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
        unplanned=tuple(_text(f) for f in unplanned),
    )


def _finished(reply: Sequence[Any]) -> Settlement:
    settled, rejected, replayed = reply
    acked, written, error = settled
    return _settlement(
        [acked, list(replayed) + list(written), error], tuple(_text(r) for r in rejected)
    )


class RedisInvocationLedger:
    """:class:`relay.application.ports.InvocationLedger` on Redis."""

    def __init__(
        self,
        client: Redis,
        *,
        acked_ttl_s: int = ACKED_TTL_S,
        scripts: Callable[[str], LuaScript] = load_script,
    ) -> None:
        """``scripts`` loads a script by name (tests give the scripts a clock of
        their own through it; production uses :func:`load_script`)."""
        self._channel = ScriptChannel(dedicated_connection(client))
        self._ttl = str(acked_ttl_s)
        self._begin = scripts("begin")
        self._finish = scripts("finish")
        self._malformed = scripts("malformed")
        self._renew = scripts("renew")
        self._begin_many = scripts("begin_many")
        self._finish_many = scripts("finish_many")

    @property
    def round_trips(self) -> int:
        """Round trips the ledger made (pipelines count once), for the benches."""
        return self._channel.round_trips

    def _head(self, ctx: MessageContext, blocked: bool) -> tuple[list[str], str]:
        keys = [
            invocation_key(ctx.stream, ctx.group, ctx.message_id),
            ctx.stream,
            dlq_key(ctx.stream),
        ]
        fields = (ctx.group, ctx.consumer, ctx.message_id, ctx.timestamp, self._ttl)
        return keys, _pack(*fields, "1" if blocked else "0")

    def _begin_args(self, request: BeginRequest) -> list[str]:
        _, head = self._head(request.context, request.blocked)
        claims = _RS.join(
            _pack(c.field, str(c.max_attempts), str(c.lease_ms)) for c in request.claims
        )
        return [
            head,
            request.classification,
            request.token,
            claims,
            _records(request.gates),
            _records(request.released),
        ]

    def _finish_args(self, request: FinishRequest) -> list[str]:
        _, head = self._head(request.context, request.blocked)
        reports = []
        for report in request.reports:
            kind, arg = _transition_args(report.transition)
            reports.append(_pack(report.field, str(report.attempt), kind, arg))
        return [
            head,
            request.token,
            _RS.join(reports),
            _records(request.gates),
            _records(request.released),
        ]

    async def begin(self, request: BeginRequest) -> BeginResult:
        keys, _ = self._head(request.context, request.blocked)
        reply = await self._channel.call(self._begin, keys, self._begin_args(request))
        return _begun(reply)

    async def finish(self, request: FinishRequest) -> Settlement:
        keys, _ = self._head(request.context, request.blocked)
        args = self._finish_args(request)
        args += [report.error for report in request.reports]
        return _finished(await self._channel.call(self._finish, keys, args))

    async def renew(self, request: RenewRequest) -> int:
        ctx = request.context
        keys = [invocation_key(ctx.stream, ctx.group, ctx.message_id)]
        args = [request.field, str(request.attempt), request.token, str(request.lease_ms)]
        return int(await self._channel.call(self._renew, keys, args))

    async def begin_many(self, requests: Sequence[BeginRequest]) -> list[BeginResult]:
        """One ``begin_many`` script call for the batch (see ``lua/begin_many.lua``)."""
        if not requests:
            return []
        if len(requests) == 1:
            return [await self.begin(requests[0])]
        keys, args = self._batch_keys(requests), []
        for request in requests:
            args += self._begin_args(request)
        replies = await self._channel.call(self._begin_many, keys, args)
        return [_begun(reply) for reply in replies]

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[Settlement]:
        """One ``finish_many`` script call for the group (see ``lua/finish_many.lua``)."""
        if not requests:
            return []
        if len(requests) == 1:
            return [await self.finish(requests[0])]
        keys, args = self._batch_keys(requests), []
        for request in requests:
            args += self._finish_args(request)
            args.append(str(len(request.reports)))
            args += [report.error for report in request.reports]
        replies = await self._channel.call(self._finish_many, keys, args)
        return [_finished(reply) for reply in replies]

    @staticmethod
    def _batch_keys(requests: Sequence[BeginRequest] | Sequence[FinishRequest]) -> list[str]:
        """Every message's ledger hash, then the (shared) stream and DLQ."""
        first = requests[0].context
        keys = [
            invocation_key(r.context.stream, r.context.group, r.context.message_id)
            for r in requests
        ]
        return [*keys, first.stream, dlq_key(first.stream)]

    async def dead_letter_malformed(self, request: MalformedRequest) -> Settlement:
        keys, head = self._head(request.context, False)
        args = [head, request.reason, request.event]
        return _settlement(await self._channel.call(self._malformed, keys, args))


# Arguments are packed into a few strings (unit separator between fields, record
# separator between records): encoding a command costs per argument, and a
# handled event sends its share of two script calls. Names never contain these
# control bytes.
_FS = "\x1f"
_RS = "\x1e"


def _pack(*fields: str) -> str:
    for field in fields:
        if _FS in field or _RS in field:
            raise ValueError(f"name contains a control character: {field!r}")
    return _FS.join(fields)


def _records(items: Sequence[str]) -> str:
    for item in items:
        if _FS in item or _RS in item:
            raise ValueError(f"name contains a control character: {item!r}")
    return _RS.join(items)
