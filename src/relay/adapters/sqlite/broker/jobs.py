"""The job table's steps: each a function ``(conn, now_ms)`` run by the writer
thread inside one group-committed ``BEGIN IMMEDIATE`` transaction (but
:func:`peek`, which writes nothing and runs on the reading connection).

A job is ``ready``, ``leased`` (to one consumer, with a random fencing token
and the time of the lease) or ``acked``. A consumer's read only peeks; the
lease is taken by :func:`hold`, in the transaction of the invocation claim.
Every transition after a lease names the lease's token; a step whose token is
no longer the job's changes nothing.
Acknowledged jobs keep their ledger rows until ``expires_ms`` (the ledger
retention), then retention deletes both; nothing else is ever deleted.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Collection, Sequence
from typing import Final

from relay.adapters.entry_trace import entry_traceparent
from relay.domain.outcome import StreamMessage
from relay.domain.priority import PRIORITIES, Candidate, choose

PURGE_BATCH: Final = 1000


def message_id(created_ms: int, seq: int) -> str:
    """The id a job is known by (the shape of a stream entry id: ``<ms>-<seq>``)."""
    return f"{created_ms}-{seq}"


def seq_of(message: str) -> int | None:
    """The row of a message id, or ``None`` for an id this broker never made."""
    _, _, tail = message.rpartition("-")
    return int(tail) if tail.isdigit() else None


def new_token() -> str:
    return secrets.token_hex(8)


def publish(
    conn: sqlite3.Connection,
    now_ms: int,
    stream: str,
    payload: bytes | None,
    priority: int,
    *,
    ready_ms: int | None = None,
    traceparent: str | None = None,
) -> str:
    """Add a job; ``ready_ms``: a delayed job's due time (``None``: ready now)."""
    cur = conn.execute(
        "INSERT INTO jobs (stream, created_ms, priority, payload, ready_ms, traceparent)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (stream, now_ms, priority, payload, ready_ms, traceparent or None),
    )
    assert cur.lastrowid is not None
    return message_id(now_ms, cur.lastrowid)


# The ``?`` ready jobs of each class that became ready first, two partial-index
# ranges per class, in one statement (each ``execute`` lets go of the GIL twice:
# fewer is faster): jobs published ready, in publish order (``jobs_ready``, no
# clock in it, as before delayed events), and delayed jobs due by now, in due
# order (``jobs_delayed``; one not due yet is never read). A job ages from when
# it became ready: its publish, or a delayed job's due time (issue 33).
_CANDIDATES: Final = " UNION ALL ".join(
    f"SELECT * FROM (SELECT {p}, created_ms, seq FROM jobs INDEXED BY jobs_ready"  # noqa: S608 - class numbers
    f" WHERE stream = ? AND state = 'ready' AND ready_ms IS NULL AND priority = {p}"
    " ORDER BY created_ms, seq LIMIT ?)"
    f" UNION ALL SELECT * FROM (SELECT {p}, ready_ms, seq FROM jobs INDEXED BY jobs_delayed"
    f" WHERE stream = ? AND state = 'ready' AND ready_ms IS NOT NULL AND priority = {p}"
    " AND ready_ms <= ? ORDER BY ready_ms, seq LIMIT ?)"
    for p in range(len(PRIORITIES))
)
# The next delayed job's due time, one seek per class.
_DUE_PER_CLASS: Final = " UNION ALL ".join(
    "SELECT (SELECT min(ready_ms) FROM jobs INDEXED BY jobs_delayed"  # noqa: S608 - class numbers
    f" WHERE stream = ? AND state = 'ready' AND ready_ms IS NOT NULL AND priority = {p}"
    " AND ready_ms > ?) AS due"
    for p in range(len(PRIORITIES))
)
_NEXT_DUE: Final = f"SELECT min(due) FROM ({_DUE_PER_CLASS})"  # noqa: S608 - constants


def _candidates(
    conn: sqlite3.Connection, stream: str, count: int, now_ms: int, skip: Collection[int] = ()
) -> list[list[Candidate]]:
    """Per class, its ``count`` longest-ready jobs not in ``skip``, first ready
    first (the ones skipped are among the rows read: ask for ``count + len(skip)``)."""
    per_class: list[list[Candidate]] = [[] for _ in PRIORITIES]
    want = count + len(skip)
    args = (stream, want, stream, now_ms, want) * len(PRIORITIES)
    merged = False
    for priority, ready_ms, seq in conn.execute(_CANDIDATES, args):
        if seq not in skip:
            found = per_class[priority]
            merged = merged or bool(found and found[-1].ready_ms > ready_ms)
            found.append(Candidate(priority, ready_ms, seq))
    if merged:  # a due delayed job among jobs published ready: one order by ready time
        per_class = [sorted(found, key=_ready_order)[:want] for found in per_class]
    return per_class


def _ready_order(candidate: Candidate) -> tuple[int, int]:
    return candidate.ready_ms, candidate.seq


def next_due(conn: sqlite3.Connection, now_ms: int, stream: str) -> int | None:
    """When the next delayed job of ``stream`` becomes ready (``None``: none waits)."""
    row = conn.execute(_NEXT_DUE, (stream, now_ms) * len(PRIORITIES)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _winners(per_class: list[list[Candidate]], now_ms: int, count: int) -> list[Candidate]:
    """``count`` claims in a row by the aging rule. Within one class the oldest job
    is always its best (aging only helps the older), so each claim chooses among
    the four heads, exactly as four single lookups per claim would."""
    filled = [c for c in per_class if c]
    if len(filled) == 1:  # one class waiting: its oldest first, whatever the aging
        return filled[0][:count]
    heads = [0] * len(per_class)
    chosen: list[Candidate] = []
    while len(chosen) < count:
        winner = choose((c[heads[i]] for i, c in enumerate(per_class) if heads[i] < len(c)),
                        now_ms)
        if winner is None:
            break
        chosen.append(winner)
        heads[winner.priority] += 1
    return chosen


def _traced(raw: str | None, message: str) -> str:
    """The job's stored traceparent (checked again: the file may be written by hand)."""
    return entry_traceparent(raw, message) if raw else ""


def claim(
    conn: sqlite3.Connection, now_ms: int, stream: str, consumer: str, count: int
) -> list[tuple[StreamMessage, str]]:
    """Lease up to ``count`` ready jobs at once, chosen by the aging rule, each
    fenced with its own token (a fresh random part per claim, plus the job's
    row): a lease without a claim (the raw loops of ``bench/broker.py`` and tests
    that need a job leased; a consumer's read peeks instead)."""
    winners = _winners(_candidates(conn, stream, count, now_ms), now_ms, count)
    if not winners:
        return []
    marks = ",".join("?" * len(winners))
    rows = conn.execute(
        "UPDATE jobs SET state = 'leased', token = ? || '.' || seq, consumer = ?,"  # noqa: S608 - placeholders
        " leased_ms = ?, deliveries = deliveries + 1"
        f" WHERE seq IN ({marks}) AND state = 'ready'"
        " RETURNING seq, created_ms, payload, deliveries, token, traceparent",
        (new_token(), consumer, now_ms, *(w.seq for w in winners)),
    ).fetchall()
    by_seq = {row[0]: row[1:] for row in rows}
    leased: list[tuple[StreamMessage, str]] = []
    for w in winners:  # in the order chosen
        created_ms, payload, deliveries, token, traced = by_seq[w.seq]
        mid = message_id(created_ms, w.seq)
        # Delivered before (put back by a restart's release or a give-back after a
        # takeover): a redelivery, exactly as a reclaimed one is (issue 35 item 3).
        message = StreamMessage(
            id=mid, payload=payload, deliveries=deliveries,
            reclaimed=deliveries > 1, delivery=token, traceparent=_traced(traced, mid),
        )
        leased.append((message, token))
    return leased


def peek(  # noqa: PLR0917 - every step has the (conn, now_ms) head
    conn: sqlite3.Connection,
    now_ms: int,
    stream: str,
    count: int,
    skip: Collection[int],
    lane: int = 0,
) -> list[StreamMessage]:
    """Up to ``count`` ready jobs, chosen by the aging rule, read without a write:
    each handed out with a fresh delivery handle ``<random>.<seq>.<deliveries>``
    that :func:`hold` leases the job with later (if it is still ready with that
    many deliveries). ``skip``: jobs already handed to another reader of this
    process; ``lane``: how many batches of ``count`` to leave to other processes
    (0 but after a collision, see :class:`relay.adapters.sqlite.broker.offers.Offers`;
    a head no longer than ``count`` leaves its older half).
    A job delivered before (``deliveries`` > 0) is a redelivery."""
    want = count * (lane + 1)
    winners = _winners(_candidates(conn, stream, want, now_ms, skip), now_ms, want)
    start = min(lane * count, max(0, len(winners) - count))
    if lane and len(winners) <= count:
        # A head too short to leave anything to the others: take its newer half
        # only, so a collision on it costs half as much (row 350).
        start = len(winners) // 2
    chosen = winners[start:start + count]
    if not chosen:
        return []
    marks = ",".join("?" * len(chosen))
    found = {
        row[0]: row[1:]
        for row in conn.execute(
            f"SELECT seq, created_ms, payload, deliveries, traceparent FROM jobs WHERE seq IN ({marks})",  # noqa: S608, E501 - placeholders
            tuple(c.seq for c in chosen),
        )
    }
    prefix = new_token()
    messages: list[StreamMessage] = []
    for c in chosen:
        created_ms, payload, seen, traced = found[c.seq]
        mid = message_id(created_ms, c.seq)
        messages.append(StreamMessage(
            id=mid, payload=payload, deliveries=seen + 1,
            reclaimed=seen > 0, delivery=f"{prefix}.{c.seq}.{seen}",
            traceparent=_traced(traced, mid),
        ))
    return messages


def reclaim(  # noqa: PLR0917 - every step has the (conn, now_ms) head
    conn: sqlite3.Connection,
    now_ms: int,
    stream: str,
    consumer: str,
    min_idle_ms: int,
    count: int,
) -> list[tuple[StreamMessage, str]]:
    """Take over leases idle at least ``min_idle_ms``, in one statement (a new token
    each: the old holder's token no longer fences anything)."""
    rows = conn.execute(
        "UPDATE jobs SET token = ? || '.' || seq, consumer = ?, leased_ms = ?,"
        " deliveries = deliveries + 1"
        " WHERE seq IN (SELECT seq FROM jobs INDEXED BY jobs_leased"
        " WHERE stream = ? AND state = 'leased' AND leased_ms <= ?"
        " ORDER BY leased_ms, seq LIMIT ?)"
        " RETURNING seq, created_ms, payload, deliveries, token, traceparent",
        (new_token(), consumer, now_ms, stream, now_ms - min_idle_ms, count),
    ).fetchall()
    taken: list[tuple[StreamMessage, str]] = []
    for seq, created_ms, payload, deliveries, token, traced in sorted(rows):
        mid = message_id(created_ms, seq)
        message = StreamMessage(id=mid, payload=payload, deliveries=deliveries, reclaimed=True,
                                delivery=token, traceparent=_traced(traced, mid))
        taken.append((message, token))
    return taken


def release_consumer(conn: sqlite3.Connection, now_ms: int, stream: str, consumer: str) -> int:
    """At a worker's start: every lease its previous process held is ready again
    and its tokens are void (that process is gone: the process lock says so)."""
    cur = conn.execute(
        "UPDATE jobs SET state = 'ready', token = NULL, consumer = NULL, leased_ms = NULL"
        " WHERE stream = ? AND state = 'leased' AND consumer = ?",
        (stream, consumer),
    )
    return cur.rowcount


def give_back(
    conn: sqlite3.Connection, now_ms: int, leased: Sequence[tuple[StreamMessage, str]]
) -> int:
    """Undo a claim (or reclaim) whose caller was cancelled before it heard of it:
    each job still under that very lease is ready again, its delivery uncounted
    and its token void. A job already taken by anyone else is left alone."""
    released = 0
    for message, token in leased:
        cur = conn.execute(
            "UPDATE jobs SET state = 'ready', token = NULL, consumer = NULL, leased_ms = NULL,"
            " deliveries = max(0, deliveries - 1)"
            " WHERE seq = ? AND state = 'leased' AND token = ?",
            (seq_of(message.id), token),
        )
        released += cur.rowcount
    return released


def acknowledge(
    conn: sqlite3.Connection, now_ms: int, seq: int, token: str | None, retention_s: int
) -> bool:
    """``leased -> acked``, fenced by the lease token; ``False`` changed nothing."""
    if token is None:
        return False
    cur = conn.execute(
        "UPDATE jobs SET state = 'acked', token = NULL, expires_ms = ?"
        " WHERE seq = ? AND state = 'leased' AND token = ?",
        (now_ms + retention_s * 1000, seq, token),
    )
    return cur.rowcount == 1


def seen_of(delivery: str) -> int:
    """How many deliveries the job had when ``delivery`` was handed out (its last
    dot-separated part), or -1 for a handle that does not say (a lease's token)."""
    _, _, tail = delivery.rpartition(".")
    parts = delivery.count(".")
    return int(tail) if parts >= 2 and tail.isdigit() else -1


def hold(
    conn: sqlite3.Connection, now_ms: int, consumer: str, wanted: Sequence[tuple[int, str | None]]
) -> set[int]:
    """Make sure each ``(seq, delivery)`` is leased under that delivery's token, in
    one statement: a job still ready with the delivery count its handle was given
    with is leased now (its delivery counted); a job already leased under that
    very token is ours still (a re-sent call; its idle time restarts). The rows
    answered are held; any other job (taken by another consumer, acknowledged,
    put back and delivered again) is not, and nothing of it changed. A job
    acknowledged already is answered too: its ledger is kept, and a delivery that
    raced the acknowledgment finds every invocation done there (as on Redis)."""
    held = lease(conn, now_ms, consumer, wanted)
    return held | acked_already(conn, [seq for seq, _ in wanted if seq not in held])


def lease(
    conn: sqlite3.Connection, now_ms: int, consumer: str, wanted: Sequence[tuple[int, str | None]]
) -> set[int]:
    """:func:`hold`'s lease alone: the jobs leased under their delivery's token now
    (or already, by a re-sent call); a job acknowledged meanwhile is not among them."""
    fenced = [(seq, token) for seq, token in wanted if token is not None]
    if not fenced:
        return set()
    values = ",".join("(?, ?, ?)" for _ in fenced)
    args: list[object] = [consumer, now_ms]
    for seq, delivery in fenced:
        args += (seq, delivery, seen_of(delivery))
    rows = conn.execute(
        "UPDATE jobs SET state = 'leased', token = w.column2, consumer = ?, leased_ms = ?,"  # noqa: S608 - placeholders
        " deliveries = deliveries + (jobs.state = 'ready')"
        f" FROM (VALUES {values}) AS w WHERE jobs.seq = w.column1"
        " AND ((jobs.state = 'ready' AND jobs.deliveries = w.column3)"
        " OR (jobs.state = 'leased' AND jobs.token = w.column2))"
        " RETURNING jobs.seq",
        args,
    ).fetchall()
    return {seq for (seq,) in rows}


def acknowledge_many(
    conn: sqlite3.Connection, now_ms: int, acks: Sequence[tuple[int, str | None]],
    retention_s: int,
) -> set[int]:
    """``leased -> acked`` for each ``(seq, token)`` still leased under that token,
    in one statement; the jobs acknowledged, now or before (a job whose token no
    longer fences it and that nobody acknowledged yet is not among them)."""
    fenced = [(seq, token) for seq, token in acks if token is not None]
    done: set[int] = set()
    if fenced:
        # A join on the primary key: each member's row is found by its seq (a
        # row-value ``IN`` scanned every lease held, by every process).
        values = ",".join("(?, ?)" for _ in fenced)
        rows = conn.execute(
            "UPDATE jobs SET state = 'acked', token = NULL, expires_ms = ?"  # noqa: S608 - placeholders
            f" FROM (VALUES {values}) AS w WHERE jobs.seq = w.column1"
            " AND jobs.state = 'leased' AND jobs.token = w.column2 RETURNING jobs.seq",
            (now_ms + retention_s * 1000, *(v for ack in fenced for v in ack)),
        ).fetchall()
        done = {seq for (seq,) in rows}
    return done | acked_already(conn, [seq for seq, _ in acks if seq not in done])


def acked_already(conn: sqlite3.Connection, seqs: Sequence[int]) -> set[int]:
    """Those of ``seqs`` acknowledged before (by this delivery or the one it raced)."""
    if not seqs:
        return set()
    marks = ",".join("?" * len(seqs))
    rows = conn.execute(
        f"SELECT seq FROM jobs WHERE state = 'acked' AND seq IN ({marks})",  # noqa: S608 - placeholders
        tuple(seqs),
    ).fetchall()
    return {seq for (seq,) in rows}


def touch(conn: sqlite3.Connection, now_ms: int, seq: int, token: str | None) -> bool:
    """Renew the job's lease (its idle time restarts), fenced by the token."""
    if token is None:
        return False
    cur = conn.execute(
        "UPDATE jobs SET leased_ms = ? WHERE seq = ? AND state = 'leased' AND token = ?",
        (now_ms, seq, token),
    )
    return cur.rowcount == 1


def purge(conn: sqlite3.Connection, now_ms: int) -> int:
    """Retention: delete acknowledged jobs past their expiry, with their ledger
    rows. Only ``acked`` rows are ever deleted."""
    rows = conn.execute(
        "SELECT seq FROM jobs INDEXED BY jobs_acked WHERE state = 'acked' AND expires_ms <= ?"
        " LIMIT ?",
        (now_ms, PURGE_BATCH),
    ).fetchall()
    seqs: Sequence[tuple[int]] = rows
    conn.executemany("DELETE FROM ledger WHERE seq = ?", seqs)
    conn.executemany("DELETE FROM jobs WHERE seq = ? AND state = 'acked'", seqs)
    return len(seqs)
