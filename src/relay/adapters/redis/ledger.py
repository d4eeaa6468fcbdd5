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

import contextlib
import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any, Final

import anyio
import anyio.lowlevel
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from relay.adapters.redis.keys import dlq_key, invocation_key, translated
from relay.domain.errors import DependencyUnavailable
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
SEND_TIMEOUT_S: Final = 30.0


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


class _Call:
    __slots__ = ("args", "done", "error", "keys", "reply", "script")

    def __init__(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> None:
        self.script = script
        self.keys = keys
        self.args = args
        self.done = False  # a flag only: callers wait on the batcher's round event
        self.reply: Any = None
        self.error: BaseException | None = None


class ScriptBatcher:
    """Coalesces concurrent script calls into one pipelined round trip.

    A caller whose call is still queued while nobody is sending becomes the
    sender for one round: it yields once so the other messages of the same read
    batch can queue their calls, then sends up to ``max_batch`` of the oldest as
    one pipeline (no MULTI: each script is atomic on its own). Every caller sends
    rounds only until its own call is answered, so under sustained load the
    sender role passes from caller to caller and nobody is held back. Waiting is
    shielded and bounded, so a call handed to Redis always reaches its caller (a
    claim taken just before shutdown is then released by the dispatcher). A
    NOSCRIPT reply falls back to the one-call path, which loads the script.
    """

    def __init__(
        self, client: Redis, *, max_batch: int = 64, timeout_s: float = SEND_TIMEOUT_S
    ) -> None:
        self._client = client
        self._queue: list[_Call] = []
        self._loaded: set[str] = set()
        self._sending = False
        self._round_done: anyio.Event | None = None
        self._max_batch = max_batch
        self._timeout_s = timeout_s
        self.round_trips = 0  # pipelines and single calls sent (for the benches)
        self.calls = 0

    async def call(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        call = _Call(script, keys, args)
        self._queue.append(call)
        self.calls += 1
        deadline = anyio.current_time() + self._timeout_s
        with anyio.CancelScope(shield=True, deadline=deadline):
            while not call.done:
                if not self._sending:
                    await self._send_round()
                else:
                    if self._round_done is None:
                        self._round_done = anyio.Event()
                    await self._round_done.wait()
        if not call.done:
            if call in self._queue:
                self._queue.remove(call)
            raise DependencyUnavailable(f"redis ledger script {script.name} timed out")
        if call.error is not None:
            raise call.error
        return call.reply

    async def _send_round(self) -> None:
        self._sending = True
        batch: list[_Call] = []
        try:
            await anyio.lowlevel.checkpoint()
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
            await self._send(batch)
        finally:
            for call in batch:
                if not call.done:  # the round was cut short (timeout)
                    call.error = DependencyUnavailable("redis ledger call was not answered")
                    call.done = True
            self._sending = False
            if self._round_done is not None:
                self._round_done.set()
                self._round_done = None

    async def _load(self, batch: list[_Call]) -> None:
        """SCRIPT LOAD what this client has not loaded yet (once, not per call)."""
        for script in {c.script.sha: c.script for c in batch}.values():
            if script.sha not in self._loaded:
                self.round_trips += 1
                with translated("SCRIPT LOAD"):
                    await self._client.script_load(script.source)
                self._loaded.add(script.sha)

    async def _send(self, batch: list[_Call]) -> None:
        with contextlib.suppress(DependencyUnavailable):
            await self._load(batch)  # if it fails, the calls below fail each to its caller
        self.round_trips += 1
        try:
            if len(batch) == 1:
                replies: list[Any] = [await self._one(batch[0])]
            else:
                replies = await self._pipeline(batch)
        except Exception as exc:  # noqa: BLE001 - handed to every caller of the batch
            replies = [exc] * len(batch)
        for call, reply in zip(batch, replies, strict=True):
            outcome = reply
            if isinstance(reply, NoScriptError):
                self._loaded.clear()  # flushed or restarted: load again next time
                try:
                    outcome = await self._one(call)
                except Exception as exc:  # noqa: BLE001 - handed to its caller
                    outcome = exc
            if isinstance(outcome, Exception):
                call.error = outcome
            else:
                call.reply = outcome
            call.done = True

    async def _one(self, call: _Call) -> Any:
        return await call.script(self._client, call.keys, call.args)

    async def _pipeline(self, batch: list[_Call]) -> list[Any]:
        with translated("ledger pipeline"):
            async with self._client.pipeline(transaction=False) as pipe:
                for call in batch:
                    pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
                replies: list[Any] = await pipe.execute(raise_on_error=False)
        return [
            DependencyUnavailable(f"redis ledger script failed: {r}")
            if isinstance(r, Exception) and not isinstance(r, NoScriptError)
            else r
            for r in replies
        ]


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
        self._batcher = ScriptBatcher(client)
        self._ttl = str(acked_ttl_s)
        self._begin = load_script("begin")
        self._finish = load_script("finish")
        self._malformed = load_script("malformed")

    @property
    def round_trips(self) -> int:
        """Round trips the ledger made (pipelines count once), for the benches."""
        return self._batcher.round_trips

    def _head(self, ctx: MessageContext, blocked: bool) -> tuple[list[str], str]:
        keys = [
            invocation_key(ctx.stream, ctx.group, ctx.message_id),
            ctx.stream,
            dlq_key(ctx.stream),
        ]
        fields = (ctx.group, ctx.consumer, ctx.message_id, ctx.timestamp, self._ttl)
        return keys, _pack(*fields, "1" if blocked else "0")

    async def begin(self, request: BeginRequest) -> BeginResult:
        keys, head = self._head(request.context, request.blocked)
        claims = _RS.join(
            _pack(c.field, str(c.max_attempts), str(c.lease_ms)) for c in request.claims
        )
        args = [head, request.classification, request.token, claims, _records(request.gates)]
        classified, statuses, settled = await self._batcher.call(self._begin, keys, args)
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
        keys, head = self._head(request.context, request.blocked)
        reports = []
        for report in request.reports:
            kind, arg = _transition_args(report.transition)
            reports.append(_pack(report.field, str(report.attempt), kind, arg))
        args = [head, request.token, _RS.join(reports), _records(request.gates)]
        args += [report.error for report in request.reports]
        settled, rejected = await self._batcher.call(self._finish, keys, args)
        return _settlement(settled, tuple(_text(r) for r in rejected))

    async def dead_letter_malformed(self, request: MalformedRequest) -> Settlement:
        keys, head = self._head(request.context, False)
        args = [head, request.reason, request.event]
        return _settlement(await self._batcher.call(self._malformed, keys, args))


# Arguments are packed into a few strings (unit separator between fields, record
# separator between records): encoding a command costs per argument, and a
# handled event sends two script calls. Names never contain these control bytes.
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
