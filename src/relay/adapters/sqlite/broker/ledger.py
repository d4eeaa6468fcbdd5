"""The invocation ledger in the broker file: the same database as the queue.

No third copy of the rules: each ledger call loads the message's ledger rows
``(seq, field, value)`` into a dict, calls :mod:`relay.domain.ledger_rules`
with effects that insert into the ``dlq`` table and acknowledge the job, and
writes the changed fields back, all inside one group-committed ``BEGIN
IMMEDIATE`` transaction. A claim and its job's lease, a DLQ entry and its
``:dlq`` marker, the last result and the acknowledgment each commit together
or not at all.

The acknowledgment is fenced by the job's lease token (the one this process
got when it leased or reclaimed the job): a worker whose job was reassigned
still records its fenced result in the ledger (the invocation's own token
decides that, as on Redis) but cannot acknowledge the new holder's job; the
holder settles it from the ledger.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, MutableMapping, Sequence
from typing import TypeVar

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

T = TypeVar("T")

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
    """The broker side of one ledger step, inside its transaction."""

    def __init__(  # noqa: PLR0917 - built in one place, from one step's values
        self,
        conn: sqlite3.Connection,
        now_ms: int,
        ctx: MessageContext,
        seq: int | None,
        token: str | None,
        retention_s: int,
        acks: list[tuple[int, int, str]],
    ) -> None:
        self._conn = conn
        self._now_ms = now_ms
        self._ctx = ctx
        self._seq = seq
        self._token = token
        self._retention_s = retention_s
        self._acks = acks
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
        if self._seq is not None:
            jobs.touch(self._conn, self._now_ms, self._seq, self._token)

    def acknowledge(self) -> None:
        self.settled = True
        if self._seq is not None and self._token is not None:
            self._acks.append((self._now_ms + self._retention_s * 1000, self._seq, self._token))


class _Ledgers:
    """The ledger rows of every message a transaction's steps are about: loaded
    with one query at the first step, changed in place by each step in turn (so
    two steps on one message in one transaction see each other's changes, as two
    transactions would), written back with one statement per kind right before
    the ``COMMIT``, with the acknowledgments."""

    def __init__(self, conn: sqlite3.Connection, keys: set[int]) -> None:
        self.loaded: dict[int, dict[str, str]] = {seq: {} for seq in keys}
        self.acks: list[tuple[int, int, str]] = []
        if keys:
            marks = ",".join("?" * len(keys))
            for seq, f, v in conn.execute(LOAD_SQL.format(marks=marks), tuple(keys)):
                self.loaded[seq][f] = v
        self.original = {seq: dict(h) for seq, h in self.loaded.items()}

    def get(self, conn: sqlite3.Connection, seq: int) -> dict[str, str]:
        if seq not in self.loaded:  # a step whose key was not given
            rows = conn.execute("SELECT field, value FROM ledger WHERE seq = ?", (seq,))
            self.loaded[seq] = dict(rows.fetchall())
            self.original[seq] = dict(self.loaded[seq])
        return self.loaded[seq]

    def flush(self, conn: sqlite3.Connection) -> None:
        gone: list[tuple[int, str]] = []
        changed: list[tuple[int, str, str]] = []
        for seq, after in self.loaded.items():
            before = self.original[seq]
            gone += [(seq, f) for f in before if f not in after]
            changed += [(seq, f, v) for f, v in after.items() if before.get(f) != v]
        if gone:
            conn.executemany("DELETE FROM ledger WHERE seq = ? AND field = ?", gone)
        if changed:
            conn.executemany(UPSERT_SQL, changed)
        if self.acks:  # leased -> acked, each fenced by its lease token
            conn.executemany(ACK_SQL, self.acks)


class SqliteInvocationLedger:
    """:class:`relay.application.ports.InvocationLedger` on the broker file."""

    def __init__(self, store: BrokerStore, *, acked_ttl_s: int = LEDGER_RETENTION_S) -> None:
        self._store = store
        self._retention_s = acked_ttl_s

    async def _step(self, ctx: MessageContext, rule: Callable[..., T]) -> T:
        seq = jobs.seq_of(ctx.message_id)
        if seq is None:
            raise DependencyUnavailable(
                f"sqlite ledger: {ctx.message_id[:40]!r} is not a message id of this broker"
            )
        store = self._store
        token = store.leases.get(seq)
        retention = self._retention_s

        def step(conn: sqlite3.Connection, now_ms: int) -> tuple[T, bool]:
            batch = store.batch
            ledgers = batch.scope.get("ledgers")
            if ledgers is None:
                ledgers = batch.scope["ledgers"] = _Ledgers(conn, batch.keys)
                batch.before_commit(ledgers.flush)
            h = ledgers.get(conn, seq)
            effects = _Effects(conn, now_ms, ctx, seq, token, retention, ledgers.acks)
            result = rule(h, now_ms, effects)
            return result, effects.settled

        result, settled = await store.write(step, key=seq)
        if settled:
            # Acknowledged, or the token no longer fences the job (acknowledged or
            # taken over elsewhere): either way this process will not use it again.
            store.leases.pop(seq, None)
        return result

    async def begin(self, request: BeginRequest) -> BeginResult:
        return await self._step(
            request.context, lambda h, now, fx: ledger_rules.begin(h, request, now, fx)
        )

    async def finish(self, request: FinishRequest) -> Settlement:
        return await self._step(
            request.context, lambda h, now, fx: ledger_rules.finish(h, request, now, fx)
        )

    async def begin_many(self, requests: Sequence[BeginRequest]) -> list[BeginResult]:
        # TODO(batched core): one atomic call for the batch; today each in turn.
        return [await self.begin(request) for request in requests]

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[Settlement]:
        return [await self.finish(request) for request in requests]

    async def dead_letter_malformed(self, request: MalformedRequest) -> Settlement:
        return await self._step(
            request.context, lambda h, now, fx: ledger_rules.dead_letter_malformed(h, request, fx)
        )

    async def renew(self, request: RenewRequest) -> int:
        """Extend the invocation's claim (the rule) and, with it, the job's lease
        (fenced by the job's token), so recovery does not take a message whose
        handler is still running and renewing."""

        def rule(h: MutableMapping[str, str], now_ms: int, fx: _Effects) -> int:
            until = ledger_rules.renew(h, request, now_ms)
            if until:
                fx.touch()
            return until

        return await self._step(request.context, rule)
