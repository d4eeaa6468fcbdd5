"""One rule set: the domain's ledger rules and the Lua scripts agree on every case.

``relay.domain.ledger_rules`` is the specification of what each ledger call does;
the Redis adapter carries it out as Lua scripts for speed (one round trip a call).
This property test runs the same random sequences of calls (begin, finish, renew,
malformed, each possibly re-sent), tokens, clocks, hand-written markers (valid and
garbage) and DLQ outages through both, on a real Redis, and requires after every
step: the same reply, the same hash, the same DLQ entries and the same
acknowledgment. Any rule changed on one side only fails here.

The scripts read the server clock (``TIME``); here their clock function is
swapped for a read of a per-message key, so both sides see the same instant.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import redis
import redis.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.adapters.redis.keys import dlq_key, invocation_key
from relay.adapters.redis.ledger import RedisInvocationLedger, script_source
from relay.adapters.redis.scripts import LuaScript
from relay.domain import ledger_rules
from relay.domain.invocation import Complete, Exhaust, Release, Retry, Transition
from relay.domain.ledger_rules import DeadLetterWriteError
from relay.domain.outcome import (
    AttemptReport,
    BeginRequest,
    BeginResult,
    ClaimRequest,
    ClaimStatus,
    DeadLettered,
    FinishRequest,
    MalformedRequest,
    MessageContext,
    RenewRequest,
    Settlement,
    split_field,
)
from tests.contract.conftest import redis_url_for

pytestmark = pytest.mark.redis

FIELDS = ("fn-a/h.one", "fn-a/h.two", "fn-b/h.one", "fn-c/x", "fn-b/h.zz")
TOKENS = ("t1", "t2")
START_MS = 1_800_000_000_000

_REAL_CLOCK = (
    "  local t = redis.call('TIME')\n"
    "  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
)
_TEST_CLOCK = "  return tonumber(redis.call('GET', KEYS[1] .. ':now'))\n"


def frozen_clock_script(name: str) -> LuaScript:
    """The production script with only its clock swapped (see the module text)."""
    source = script_source(name)
    assert source.count(_REAL_CLOCK) == 1, "the scripts' clock function changed: update this test"
    return LuaScript(name, source.replace(_REAL_CLOCK, _TEST_CLOCK))


# --- the model side: the domain's rules on a dict ------------------------------------


@dataclass
class Model:
    hash: dict[str, str] = field(default_factory=dict)
    dlq: list[tuple[str, str, int, str]] = field(default_factory=list)  # fn, handler, n, reason
    acked: bool = False
    # Redis keeps a TTL only on a key that exists: an ACK of a hash that holds
    # nothing (a class not known yet records nothing) sets none, a later one does
    ttl: bool = False
    broken: bool = False
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def _append(self, entry: tuple[str, str, int, str]) -> str:
        if self.broken:
            raise DeadLetterWriteError("WRONGTYPE")
        self.dlq.append(entry)
        return f"{next(self.ids)}-0"

    def dead_letter(self, field: str, attempt: int, reason: str) -> str:
        function, handler = split_field(field)
        return self._append((function, handler, attempt, reason))

    def dead_letter_malformed(self, reason: str, event: str) -> str:
        return self._append(("-", "-", 0, reason))

    def acknowledge(self) -> None:
        self.acked = True
        self.ttl = self.ttl or bool(self.hash)


# --- operations ------------------------------------------------------------------------

markers = st.one_of(
    st.sampled_from(["ok", "exhausted:1", "exhausted:2:dlq", "exhausted:3:", "garbage", ""]),
    st.builds(
        lambda d, a, t: f"running:{START_MS + d}#{a}#{t}",
        st.sampled_from([-1, 0, 1, 5_000, 10**6]),
        st.integers(0, 3),
        st.sampled_from(TOKENS),
    ),
    st.builds(
        lambda d, a: f"next_attempt_at:{START_MS + d}#{a}",
        st.sampled_from([-1, 0, 1, 5_000, 10**6]),
        st.integers(0, 3),
    ),
    st.sampled_from(["running:1#1#t1#x", "next_attempt_at:12#", "exhausted:007", "ok "]),
)
subset = st.lists(st.sampled_from(FIELDS), unique=True, max_size=3).map(tuple)
transitions: st.SearchStrategy[Transition] = st.one_of(
    st.just(Complete()),
    st.builds(Retry, st.sampled_from([1_000, 60_000])),
    st.just(Exhaust()),
    st.builds(Release, st.one_of(st.just(""), markers)),
)


@st.composite
def begins(draw: st.DrawFn) -> tuple[str, Any]:
    claims = tuple(
        ClaimRequest(
            field=f,
            max_attempts=draw(st.integers(0, 3)),
            lease_ms=draw(st.sampled_from([1_000, 60_000])),
        )
        for f in draw(subset)
    )
    return "begin", {
        "token": draw(st.sampled_from(TOKENS)),
        "classification": draw(st.sampled_from(["matched:fn-a", "unmatched", ""])),
        "claims": claims,
        "gates": draw(subset),
        "released": draw(subset),
        "blocked": draw(st.booleans()),
    }


@st.composite
def finishes(draw: st.DrawFn) -> tuple[str, Any]:
    reports = tuple(
        AttemptReport(
            field=f,
            attempt=draw(st.integers(1, 2)),
            transition=draw(transitions),
            error=draw(st.sampled_from(["", "boom", "retries exhausted after 2 attempt(s): x"])),
        )
        for f in draw(subset)
    )
    return "finish", {
        "token": draw(st.sampled_from(TOKENS)),
        "reports": reports,
        "gates": draw(subset),
        "released": draw(subset),
        "blocked": draw(st.booleans()),
    }


@st.composite
def finishes_of_claims(draw: st.DrawFn) -> tuple[str, Any]:
    """A finish of what the last begin claimed (resolved when it runs): the path
    every handled event takes, with a chance of a stale token or a wrong attempt."""
    return "finish_claimed", {
        "steps": draw(
            st.lists(st.tuples(transitions, st.sampled_from([0, 0, 0, 1])), min_size=3, max_size=3)
        ),
        "other_token": draw(st.sampled_from([False, False, False, True])),
        "errors": draw(st.sampled_from(["", "boom"])),
    }


operations = st.one_of(
    begins(),
    finishes_of_claims(),
    finishes_of_claims(),
    finishes(),
    st.tuples(
        st.just("renew"),
        st.fixed_dictionaries(
            {
                "token": st.sampled_from(TOKENS),
                "field": st.sampled_from(FIELDS),
                "attempt": st.integers(1, 3),
                "lease_ms": st.sampled_from([1_000, 60_000]),
            }
        ),
    ),
    st.tuples(st.just("malformed"), st.sampled_from(["not JSON", "too big"])),
    st.tuples(st.just("advance"), st.sampled_from([1, 999, 1_000, 60_000, 10**6])),
    st.tuples(st.just("set"), st.tuples(st.sampled_from(FIELDS), markers)),
    st.tuples(st.just("dlq"), st.booleans()),  # True: the DLQ breaks; False: it works
    st.tuples(st.just("resend"), st.none()),
    st.tuples(st.just("resend"), st.none()),  # twice as likely: every call must be repeatable
    st.tuples(st.just("set"), st.tuples(st.sampled_from(FIELDS), st.just("exhausted:1"))),
)
sequences = st.tuples(
    st.one_of(begins(), st.tuples(st.just("malformed"), st.just("x"))),
    st.lists(operations, max_size=16),
)


# --- the comparison --------------------------------------------------------------------


class Ids:
    """DLQ entry ids differ between the sides: compare their order instead."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, entry_id: str) -> str:
        return f"#{self.seen.setdefault(entry_id, len(self.seen))}"


def normal_settlement(s: Settlement, ids: Ids) -> Any:
    return (
        s.acknowledged,
        tuple((d.field, d.attempt, ids(d.entry_id), d.reason) for d in s.dead_lettered),
        bool(s.dlq_error),
        s.rejected,
    )


def normal_reply(reply: Any, ids: Ids) -> Any:
    if isinstance(reply, BeginResult):
        return (
            reply.newly_classified,
            reply.statuses,
            normal_settlement(reply.settlement, ids),
            reply.unplanned,
        )
    if isinstance(reply, Settlement):
        return normal_settlement(reply, ids)
    return reply


def normal_hash(h: dict[str, str], ids: Ids) -> dict[str, str]:
    return {k: (ids(v) if k == "@dlq" or k.startswith("@dlq:") else v) for k, v in h.items()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class LuaSide:
    def __init__(self, client: redis.asyncio.Redis, stream: str, message_id: str) -> None:
        self.client = client
        self.stream = stream
        self.message_id = message_id
        self.key = invocation_key(stream, "relay", message_id)
        self.dlq_key = dlq_key(stream)
        self.ledger = RedisInvocationLedger(client, scripts=frozen_clock_script)

    async def set_now(self, now_ms: int) -> None:
        await self.client.set(self.key + ":now", str(now_ms))

    async def state(self) -> tuple[dict[str, str], list[tuple[str, str, int, str]], bool, bool]:
        h = {_text(k): _text(v) for k, v in (await self.client.hgetall(self.key)).items()}
        kind = _text(await self.client.type(self.dlq_key))
        rows: Any = await self.client.xrange(self.dlq_key) if kind == "stream" else []
        saved: Any = []
        if kind != "stream" and _text(await self.client.type(self.dlq_key + ":saved")) == "stream":
            saved = await self.client.xrange(self.dlq_key + ":saved")
        dlq = []
        for _, raw in list(saved) + list(rows):
            f = {_text(k): _text(v) for k, v in raw.items()}
            dlq.append((f["function"], f["handler"], int(f["handler_attempts"]), f["reason"]))
        pending = await self.client.xpending_range(self.stream, "relay", "-", "+", 10)
        acked = not any(_text(p["message_id"]) == self.message_id for p in pending)
        has_ttl = int(await self.client.ttl(self.key)) > 0
        return h, dlq, acked, has_ttl

    async def break_dlq(self, broken: bool) -> None:
        saved = self.dlq_key + ":saved"
        if broken and _text(await self.client.type(self.dlq_key)) != "string":
            if await self.client.exists(self.dlq_key):
                await self.client.rename(self.dlq_key, saved)
            await self.client.set(self.dlq_key, "not a stream")
        elif not broken and _text(await self.client.type(self.dlq_key)) == "string":
            await self.client.delete(self.dlq_key)
            if await self.client.exists(saved):
                await self.client.rename(saved, self.dlq_key)


def context(stream: str, message_id: str) -> MessageContext:
    return MessageContext(
        stream=stream, group="relay", consumer="w1", message_id=message_id, timestamp="t"
    )


def build(kind: str, args: Any, ctx: MessageContext) -> Any:
    if kind == "begin":
        return BeginRequest(context=ctx, **args)
    if kind == "finish":
        return FinishRequest(context=ctx, **args)
    if kind == "renew":
        return RenewRequest(context=ctx, **args)
    return MalformedRequest(context=ctx, reason=args, event="{")


def finish_of(
    begin: BeginRequest, statuses: tuple[ClaimStatus, ...], args: Any, ctx: MessageContext
) -> FinishRequest:
    claimed = [s for s in statuses if s.status == "claimed"]
    reports = tuple(
        AttemptReport(
            field=s.field,
            attempt=s.attempt + delta,
            transition=Release(s.previous) if isinstance(t, Release) else t,
            error=args["errors"],
        )
        for s, (t, delta) in zip(claimed, args["steps"], strict=False)
    )
    token = "t9" if args["other_token"] else begin.token
    return FinishRequest(
        context=ctx,
        token=token,
        reports=reports,
        gates=begin.gates,
        released=begin.released,
        blocked=begin.blocked,
    )


def on_model(model: Model, request: Any, now_ms: int) -> Any:
    h = model.hash
    if isinstance(request, BeginRequest):
        return ledger_rules.begin(h, request, now_ms, model)
    if isinstance(request, FinishRequest):
        return ledger_rules.finish(h, request, now_ms, model)
    if isinstance(request, RenewRequest):
        return ledger_rules.renew(h, request, now_ms)
    return ledger_rules.dead_letter_malformed(h, request, model)


async def on_lua(lua: LuaSide, request: Any) -> Any:
    ledger = lua.ledger
    if isinstance(request, BeginRequest):
        return await ledger.begin(request)
    if isinstance(request, FinishRequest):
        return await ledger.finish(request)
    if isinstance(request, RenewRequest):
        return await ledger.renew(request)
    return await ledger.dead_letter_malformed(request)


async def run_sequence(url: str, steps: list[tuple[str, Any]], serial: int) -> None:
    client = redis.asyncio.Redis.from_url(url, decode_responses=False)
    stream = f"rules-vs-lua-{serial}"
    try:
        await client.delete(stream, dlq_key(stream), dlq_key(stream) + ":saved")
        await client.xgroup_create(stream, "relay", id="0", mkstream=True)
        message_id = _text(await client.xadd(stream, {"event": b'{"a": 1}'}))
        await client.xreadgroup("relay", "w1", {stream: ">"}, count=1)
        lua = LuaSide(client, stream, message_id)
        ctx = context(stream, message_id)
        model = Model()
        model_ids, lua_ids = Ids(), Ids()
        now = START_MS
        last: Any = None
        last_begin: BeginRequest | None = None
        last_claimed: tuple[ClaimStatus, ...] = ()
        for number, (kind, args) in enumerate(steps):
            if kind == "advance":
                now += args
                continue
            if kind == "set":
                field_name, value = args
                model.hash[field_name] = value
                await client.hset(lua.key, field_name, value)
                continue
            if kind == "dlq":
                model.broken = args
                await lua.break_dlq(args)
                continue
            if kind == "resend":
                if last is None:
                    continue
                request = last
            elif kind == "finish_claimed":
                if not isinstance(last_begin, BeginRequest):
                    continue
                request = last = finish_of(last_begin, last_claimed, args, ctx)
            else:
                request = last = build(kind, args, ctx)
            await lua.set_now(now)
            reply = on_model(model, request, now)
            if isinstance(request, BeginRequest):
                last_begin, last_claimed = request, reply.statuses
            want = normal_reply(reply, model_ids)
            got = normal_reply(await on_lua(lua, request), lua_ids)
            where = f"step {number}: {request!r}"
            assert got == want, where
            h, dlq, acked, has_ttl = await lua.state()
            assert normal_hash(h, lua_ids) == normal_hash(model.hash, model_ids), where
            assert dlq == model.dlq, where
            assert (acked, has_ttl) == (model.acked, model.ttl), where
    finally:
        await client.delete(stream, dlq_key(stream), dlq_key(stream) + ":saved")
        await client.aclose()


_serial = itertools.count()


@settings(
    # 4x the profile's examples (400 in the quick one): the sequences are long.
    max_examples=4 * settings().max_examples,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=sequences)
def test_the_lua_scripts_do_what_the_domain_rules_say(
    request: pytest.FixtureRequest, sequence: tuple[tuple[str, Any], list[tuple[str, Any]]]
) -> None:
    first, rest = sequence
    url = redis_url_for(request)
    anyio.run(run_sequence, url, [first, *rest], next(_serial))


def test_every_reason_text_in_the_scripts_comes_from_the_domain() -> None:
    """The scripts hold no reason text of their own: they format the constants the
    adapter generates from relay.domain (defined once)."""
    for name in ("begin", "finish", "malformed", "renew"):
        body = script_source(name).split("pcall(redis.replicate_commands)", 1)[1]
        assert "retries exhausted" not in body
        assert "did not finish" not in body
        assert "no result recorded" not in body


def test_a_re_sent_finish_reports_what_its_first_send_did() -> None:
    """Defect 6 of the review, on the rules themselves: a re-sent finish was
    reported as fenced and its DLQ entry went unreported."""
    model = Model()
    ctx = context("s", "1-0")
    field_name = FIELDS[0]
    claim = ClaimRequest(field=field_name, max_attempts=1, lease_ms=60_000)
    begin = BeginRequest(
        context=ctx,
        classification="matched:fn-a",
        token="t1",
        claims=(claim,),
        gates=(field_name,),
    )
    started = ledger_rules.begin(model.hash, begin, START_MS, model)
    assert started.statuses[0].status == "claimed"
    again = ledger_rules.begin(model.hash, begin, START_MS + 5, model)
    assert again.statuses == started.statuses  # a re-sent begin burns nothing
    assert again.newly_classified
    report = AttemptReport(field=field_name, attempt=1, transition=Exhaust(), error="boom")
    finish = FinishRequest(context=ctx, token="t1", reports=(report,), gates=(field_name,))
    first = ledger_rules.finish(model.hash, finish, START_MS + 10, model)
    second = ledger_rules.finish(model.hash, finish, START_MS + 11, model)
    assert first.rejected == second.rejected == ()
    assert first.acknowledged
    assert second.acknowledged
    assert (
        first.dead_lettered
        == second.dead_lettered
        == (DeadLettered(field=field_name, attempt=1, entry_id="1-0", reason="boom"),)
    )
    assert len(model.dlq) == 1


# --- the batched calls: begin_many / finish_many over a mix of messages ----------------

# What a batch member's hash holds before the batch: nothing (fresh), a live claim of
# another token (running), a live claim of ours or an expired one, a claim of a
# newer attempt (so our finish is fenced), an exhausted invocation with or without
# its DLQ entry, a garbage marker, or a message already dead-lettered as malformed.
member_states = st.sampled_from(
    ["fresh", "running", "expired", "fenced", "exhausted", "exhausted_dlq", "garbage",
     "malformed"]
)


def preset(state: str, field_name: str, now: int) -> dict[str, str]:
    return {
        "fresh": {},
        "running": {field_name: f"running:{now + 60_000}#1#t2"},
        "expired": {field_name: f"running:{now - 1}#1#t2"},
        "fenced": {},  # fenced after the begin (see run_batch)
        "exhausted": {field_name: "exhausted:2"},
        "exhausted_dlq": {field_name: "exhausted:2:dlq"},
        "garbage": {field_name: "running:1#1#t1#x"},
        "malformed": {},  # dead-lettered as malformed before the batch (see run_batch)
    }[state]


@st.composite
def batch_members(draw: st.DrawFn) -> dict[str, Any]:
    fields = draw(st.lists(st.sampled_from(FIELDS), unique=True, min_size=1, max_size=3))
    return {
        "state": draw(member_states),
        "claims": tuple(
            ClaimRequest(
                field=f,
                max_attempts=draw(st.integers(1, 3)),
                lease_ms=draw(st.sampled_from([1_000, 60_000])),
            )
            for f in fields
        ),
        "gates": tuple(fields),
        "blocked": draw(st.sampled_from([False, False, False, True])),
        "steps": draw(st.lists(transitions, min_size=3, max_size=3)),
        "error": draw(st.sampled_from(["", "boom"])),
    }


async def run_batch(url: str, members: list[dict[str, Any]], serial: int, dlq_broken: bool) -> None:
    """Every member through the domain's rules one by one and through one
    begin_many, one finish_many, then the same finish_many re-sent."""
    client = redis.asyncio.Redis.from_url(url, decode_responses=False)
    stream = f"rules-vs-lua-batch-{serial}"
    try:
        await client.delete(stream, dlq_key(stream), dlq_key(stream) + ":saved")
        await client.xgroup_create(stream, "relay", id="0", mkstream=True)
        sides: list[tuple[LuaSide, Model, MessageContext]] = []
        entry_ids = itertools.count(1)  # one DLQ stream: the models share its ids
        for _ in members:
            message_id = _text(await client.xadd(stream, {"event": b'{"a": 1}'}))
            lua = LuaSide(client, stream, message_id)
            sides.append((lua, Model(ids=entry_ids), context(stream, message_id)))
        await client.xreadgroup("relay", "w1", {stream: ">"}, count=len(members))
        now = START_MS
        ledger = sides[0][0].ledger
        model_ids, lua_ids = Ids(), Ids()
        begins: list[BeginRequest] = []
        for member, (lua, model, ctx) in zip(members, sides, strict=True):
            await lua.set_now(now)
            for field_name, value in preset(member["state"], member["gates"][0], now).items():
                model.hash[field_name] = value
                await client.hset(lua.key, field_name, value)
            if member["state"] == "malformed":
                bad = MalformedRequest(context=ctx, reason="not JSON", event="{")
                want = normal_reply(ledger_rules.dead_letter_malformed(model.hash, bad, model),
                                    model_ids)
                assert normal_reply(await lua.ledger.dead_letter_malformed(bad), lua_ids) == want
            begins.append(
                BeginRequest(
                    context=ctx, classification="matched:fn-a", token="t1",
                    claims=member["claims"], gates=member["gates"], blocked=member["blocked"],
                )
            )
        if dlq_broken:
            for _, model, _ in sides:
                model.broken = True
            await sides[0][0].break_dlq(True)
        want_begun = [
            ledger_rules.begin(model.hash, req, now, model)
            for req, (_, model, _) in zip(begins, sides, strict=True)
        ]
        got_begun = await ledger.begin_many(begins)
        assert [normal_reply(r, lua_ids) for r in got_begun] == [
            normal_reply(r, model_ids) for r in want_begun
        ]
        await compare_states(sides, model_ids, lua_ids)
        finishes = []
        for member, req, begun, (lua, model, ctx) in zip(
            members, begins, want_begun, sides, strict=True
        ):
            args = {"steps": [(t, 0) for t in member["steps"]], "other_token": False,
                    "errors": member["error"]}
            finishes.append(finish_of(req, begun.statuses, args, ctx))
            if member["state"] == "fenced":
                for s in begun.statuses:  # a newer delivery took the claim meanwhile
                    if s.status == "claimed":
                        marker = f"running:{now + 90_000}#{s.attempt + 1}#t2"
                        model.hash[s.field] = marker
                        await client.hset(lua.key, s.field, marker)
        now += 1_000
        for lua, _, _ in sides:
            await lua.set_now(now)
        for _ in range(2):  # the second: the same group re-sent (a broken connection)
            want_done = [
                ledger_rules.finish(model.hash, req, now, model)
                for req, (_, model, _) in zip(finishes, sides, strict=True)
            ]
            got_done = await ledger.finish_many(finishes)
            assert [normal_reply(r, lua_ids) for r in got_done] == [
                normal_reply(r, model_ids) for r in want_done
            ]
            await compare_states(sides, model_ids, lua_ids)
    finally:
        await client.delete(stream, dlq_key(stream), dlq_key(stream) + ":saved")
        await client.aclose()


async def compare_states(
    sides: list[tuple[LuaSide, Model, MessageContext]], model_ids: Ids, lua_ids: Ids
) -> None:
    dlq_rows: list[tuple[str, str, int, str]] = []
    got_rows: list[tuple[str, str, int, str]] = []
    for lua, model, ctx in sides:
        h, dlq, acked, has_ttl = await lua.state()
        where = ctx.message_id
        assert normal_hash(h, lua_ids) == normal_hash(model.hash, model_ids), where
        assert (acked, has_ttl) == (model.acked, model.ttl), where
        dlq_rows += model.dlq
        got_rows = dlq  # one DLQ stream for the whole batch
    assert sorted(got_rows) == sorted(dlq_rows)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    members=st.lists(batch_members(), min_size=2, max_size=5),
    dlq_broken=st.sampled_from([False, False, False, True]),
)
def test_the_batched_scripts_do_what_the_domain_rules_say_per_member(
    request: pytest.FixtureRequest, members: list[dict[str, Any]], dlq_broken: bool
) -> None:
    """A batch mixing fresh, running, expired, fenced, exhausted, garbage and
    malformed members: begin_many and finish_many (and a re-sent finish_many)
    answer and write exactly what the rules say for each member on its own."""
    url = redis_url_for(request)
    anyio.run(run_batch, url, members, next(_serial), dlq_broken)
