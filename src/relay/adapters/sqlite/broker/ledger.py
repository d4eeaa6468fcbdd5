"""The invocation ledger in the broker file: the same database as the queue.

No third copy of the rules: each ledger call (one message or a batch of them) is
one writer step, so one group-committed ``BEGIN IMMEDIATE`` transaction: it loads
its messages' ledger rows ``(seq, field, value)`` with one query, calls
:mod:`relay.domain.ledger_rules` per message with effects that insert into the
``dlq`` table and acknowledge the job, and writes the changed fields back with
one statement per kind. A begin first leases each job with its delivery handle
(:func:`jobs.hold`), so a job's lease and its invocation claim, a DLQ entry and
its ``:dlq`` marker, the last result and the acknowledgment each commit together
or not at all.

The acknowledgment is fenced by the job's lease token (the delivery handle its
begin leased it with, or a reclaim's): a worker whose job was reassigned still
records its fenced result in the ledger (the invocation's own token decides
that, as on Redis) but cannot acknowledge the new holder's job, and is told it
did not; the holder settles it from the ledger.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any, Final

import msgspec

from relay.adapters.sqlite.broker import jobs
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.domain import ledger_rules
from relay.domain.errors import DependencyUnavailable
from relay.domain.invocation import LEDGER_RETENTION_S
from relay.domain.ledger_rules import DeadLetterWriteError
from relay.domain.outcome import (
    BeginRequest,
    BeginResult,
    DeadLetterEntry,
    FinishRequest,
    MalformedRequest,
    MessageContext,
    RenewRequest,
    Settlement,
    split_field,
)

# The statements a transaction's ledger steps share (``bench/broker.py``'s raw loop
# runs the same text).
LOAD_SQL = "SELECT seq, field, value FROM ledger WHERE seq IN ({marks})"
UPSERT_SQL = (
    "INSERT INTO ledger (seq, field, value) VALUES (?, ?, ?)"
    " ON CONFLICT (seq, field) DO UPDATE SET value = excluded.value"
)
ACK_SQL = (
    "UPDATE jobs SET state = 'acked', token = NULL, expires_ms = ?"
    " WHERE seq = ? AND state = 'leased' AND token = ?"
)


def insert_dead_letter(conn: sqlite3.Connection, now_ms: int, entry: DeadLetterEntry) -> str:
    """One DLQ row; its id (``<ms>-<seq>``, the shape of a stream entry id)."""
    cur = conn.execute(
        "INSERT INTO dlq (created_ms, original_stream, original_id, grp, consumer, event,"
        " reason, function, handler, deliveries, handler_attempts, timestamp)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            now_ms, entry.original_stream, entry.original_id, entry.group, entry.consumer,
            entry.event, entry.reason, entry.function, entry.handler, entry.deliveries,
            entry.handler_attempts, entry.timestamp,
        ),
    )
    assert cur.lastrowid is not None
    return jobs.message_id(now_ms, cur.lastrowid)


class _Effects:
    """The broker side of one member's ledger rule, inside its transaction."""

    __slots__ = ("_conn", "_ctx", "_now_ms", "_seq", "_token", "settled")

    def __init__(self, conn: sqlite3.Connection, now_ms: int, member: _Member) -> None:
        self._conn = conn
        self._now_ms = now_ms
        self._ctx = member.ctx
        self._seq = member.seq
        self._token = member.token
        self.settled = False  # the rule asked for the acknowledgment

    def _job(self) -> tuple[bytes | None, int]:
        row = self._conn.execute(
            "SELECT payload, deliveries FROM jobs WHERE seq = ?", (self._seq,)
        ).fetchone()
        return (row[0], max(1, row[1])) if row else (None, 1)

    def _append(self, entry: DeadLetterEntry) -> str:
        try:
            return insert_dead_letter(self._conn, self._now_ms, entry)
        except sqlite3.Error as exc:
            if not self._conn.in_transaction:
                # SQLite rolled the whole transaction back by itself (a full disk,
                # an I/O error): not this entry's failure but the batch's. Going on
                # would run the rest of the batch in autocommit (row 170).
                raise TransactionLost(str(exc)) from exc
            raise DeadLetterWriteError(f"sqlite dead-letter insert failed: {exc}") from exc

    def _entry(  # noqa: PLR0917 - the entry's own fields, in its order
        self, event: str, reason: str, function: str, handler: str, attempts: int,
        deliveries: int,
    ) -> DeadLetterEntry:
        ctx = self._ctx
        return DeadLetterEntry(
            original_stream=ctx.stream, original_id=ctx.message_id, group=ctx.group,
            consumer=ctx.consumer, event=event, reason=reason, function=function,
            handler=handler, deliveries=deliveries, handler_attempts=attempts,
            timestamp=ctx.timestamp,
        )

    def dead_letter(self, field: str, attempt: int, reason: str) -> str:
        function, handler = split_field(field)
        payload, deliveries = self._job()
        event = (payload or b"").decode("utf-8", "replace")
        return self._append(self._entry(event, reason, function, handler, attempt, deliveries))

    def dead_letter_malformed(self, reason: str, event: str) -> str:
        _, deliveries = self._job()
        return self._append(self._entry(event, reason, "-", "-", 0, deliveries))

    def touch(self) -> None:
        jobs.touch(self._conn, self._now_ms, self._seq, self._token)

    def acknowledge(self) -> None:
        self.settled = True


class _Member:
    """One request of a ledger call: its message's row, the delivery's token (the
    fence of the job's lease) and the rule to run on its ledger."""

    __slots__ = ("ctx", "rule", "seq", "token")

    def __init__(self, ctx: MessageContext, seq: int, token: str | None, rule: Rule) -> None:
        self.ctx = ctx
        self.seq = seq
        self.token = token
        self.rule = rule


Rule = Callable[[MutableMapping[str, str], int, _Effects], Any]


def _load(conn: sqlite3.Connection, seqs: Sequence[int]) -> dict[int, dict[str, str]]:
    loaded: dict[int, dict[str, str]] = {seq: {} for seq in seqs}
    marks = ",".join("?" * len(loaded))
    for seq, f, v in conn.execute(LOAD_SQL.format(marks=marks), tuple(loaded)):
        loaded[seq][f] = v
    return loaded


def _write_back(
    conn: sqlite3.Connection, loaded: dict[int, dict[str, str]], before: dict[int, dict[str, str]]
) -> None:
    """Only what changed, one statement per kind for the whole call (the
    differences taken by set operations on the dicts' views, in C: a Python loop
    over every field of every member was a fifth of the writer's own time)."""
    gone: list[tuple[int, str]] = []
    changed: list[tuple[int, str, str]] = []
    for seq, after in loaded.items():
        was = before[seq]
        gone += [(seq, f) for f in was.keys() - after.keys()]
        changed += [(seq, f, v) for f, v in after.items() - was.items()]
    if gone:
        conn.executemany("DELETE FROM ledger WHERE seq = ? AND field = ?", gone)
    if changed:
        conn.executemany(UPSERT_SQL, changed)


def _unacknowledged(result: Any) -> Any:
    """The rule's answer, told that its fenced acknowledgment changed nothing."""
    if isinstance(result, Settlement):
        return msgspec.structs.replace(result, acknowledged=False)
    if isinstance(result, BeginResult):
        settlement = msgspec.structs.replace(result.settlement, acknowledged=False)
        return msgspec.structs.replace(result, settlement=settlement)
    return result


def run_members(
    conn: sqlite3.Connection, now_ms: int, members: Sequence[_Member], retention_s: int
) -> list[Any]:
    """Every member's rule on its message's ledger, in order, then what they changed
    and their fenced acknowledgments written back: one load, one write per kind,
    one acknowledgment statement for the whole call. A member whose rule asked
    for the acknowledgment but whose token no longer fences its job is answered
    as not acknowledged (the holder of the job settles it from the ledger)."""
    loaded = _load(conn, [m.seq for m in members])
    before = {seq: dict(h) for seq, h in loaded.items()}
    answers: list[tuple[Any, _Effects]] = []
    for member in members:
        effects = _Effects(conn, now_ms, member)
        answers.append((member.rule(loaded[member.seq], now_ms, effects), effects))
    _write_back(conn, loaded, before)
    asked = [(m.seq, m.token) for m, (_, fx) in zip(members, answers, strict=True) if fx.settled]
    acked = jobs.acknowledge_many(conn, now_ms, asked, retention_s)
    return [
        result if m.seq in acked or not fx.settled else _unacknowledged(result)
        for m, (result, fx) in zip(members, answers, strict=True)
    ]


class TransactionLost(sqlite3.OperationalError):
    """SQLite rolled the writer's transaction back by itself (``SQLITE_FULL``, an
    I/O error): the store fails every caller of the batch."""


class SqliteInvocationLedger:
    """:class:`relay.application.ports.InvocationLedger` on the broker file.

    Every call, single or many, is one writer step: one transaction with the
    other steps of its group commit. ``begin_many`` first holds every member's
    job under its delivery's token (one statement, :func:`jobs.hold`) and answers
    ``lost`` for a job it cannot hold, then runs the rules of the rest."""

    def __init__(self, store: BrokerStore, *, acked_ttl_s: int = LEDGER_RETENTION_S) -> None:
        self._store = store
        self._retention_s = acked_ttl_s

    def _member(self, ctx: MessageContext, rule: Rule) -> _Member:
        seq = jobs.seq_of(ctx.message_id)
        if seq is None:
            raise DependencyUnavailable(
                f"sqlite ledger: {ctx.message_id[:40]!r} is not a message id of this broker"
            )
        # The delivery's handle travels on the message (``StreamMessage.delivery``,
        # then ``MessageContext.delivery``): without one, a call can neither lease
        # nor acknowledge the job (it fences nothing), only run its rule.
        return _Member(ctx, seq, ctx.delivery or None, rule)

    async def _run(self, members: list[_Member], *, hold: bool) -> list[Any]:
        store, retention, offers = self._store, self._retention_s, self._store.offers

        def step(conn: sqlite3.Connection, now_ms: int) -> list[Any]:
            held = None
            if hold:
                wanted = [(m.seq, m.token) for m in members]
                leased = jobs.lease(conn, now_ms, members[0].ctx.consumer, wanted)
                seqs = [m.seq for m in members]
                # As jobs.hold: a job acknowledged already is answered from its ledger.
                held = leased | jobs.acked_already(conn, [s for s in seqs if s not in leased])
                # The offers are withdrawn once the leases are visible (committed,
                # or rolled back: ready again). A job not leased here was taken by
                # a reader of another process, and maybe settled by it already: a
                # collision either way (see Offers).
                collided = len(leased) < len(members)
                store.batch.at_end(lambda: offers.begun(seqs, collided=collided))
            running = [m for m in members if held is None or m.seq in held]
            answers = iter(run_members(conn, now_ms, running, retention) if running else [])
            return [next(answers) if held is None or m.seq in held else LOST for m in members]

        return list(await self._store.write(step))

    async def begin(self, request: BeginRequest) -> BeginResult:
        [result] = await self.begin_many([request])
        return result

    async def finish(self, request: FinishRequest) -> Settlement:
        [result] = await self.finish_many([request])
        return result

    async def begin_many(self, requests: Sequence[BeginRequest]) -> list[BeginResult]:
        if not requests:
            return []
        members = [self._member(r.context, _begin_rule(r)) for r in requests]
        return list(await self._run(members, hold=True))

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[Settlement]:
        if not requests:
            return []
        members = [self._member(r.context, _finish_rule(r)) for r in requests]
        return list(await self._run(members, hold=False))

    async def dead_letter_malformed(self, request: MalformedRequest) -> Settlement:
        def rule(h: MutableMapping[str, str], now_ms: int, fx: _Effects) -> Settlement:
            return ledger_rules.dead_letter_malformed(h, request, fx)

        [result] = await self._run([self._member(request.context, rule)], hold=True)
        return Settlement() if result is LOST else result

    async def renew(self, request: RenewRequest) -> int:
        """Extend the invocation's claim (the rule) and, with it, the job's lease
        (fenced by the job's token), so recovery does not take a message whose
        handler is still running and renewing."""

        def rule(h: MutableMapping[str, str], now_ms: int, fx: _Effects) -> int:
            until = ledger_rules.renew(h, request, now_ms)
            if until:
                fx.touch()
            return until

        [result] = await self._run([self._member(request.context, rule)], hold=False)
        return int(result)


LOST: Final = BeginResult(newly_classified=False, statuses=(), lost=True)


def _begin_rule(request: BeginRequest) -> Rule:
    return lambda h, now_ms, fx: ledger_rules.begin(h, request, now_ms, fx)


def _finish_rule(request: FinishRequest) -> Rule:
    return lambda h, now_ms, fx: ledger_rules.finish(h, request, now_ms, fx)
