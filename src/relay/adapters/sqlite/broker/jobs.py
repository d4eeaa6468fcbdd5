"""The job table's steps: each a function ``(conn, now_ms)`` run by the writer
thread inside one group-committed ``BEGIN IMMEDIATE`` transaction.

A job is ``ready``, ``leased`` (to one consumer, with a random fencing token
and the time of the lease) or ``acked``. Every transition after a lease names
the lease's token; a step whose token is no longer the job's changes nothing.
Acknowledged jobs keep their ledger rows until ``expires_ms`` (the ledger
retention), then retention deletes both; nothing else is ever deleted.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Sequence
from typing import Final

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
    conn: sqlite3.Connection, now_ms: int, stream: str, payload: bytes | None, priority: int
) -> str:
    cur = conn.execute(
        "INSERT INTO jobs (stream, created_ms, priority, payload) VALUES (?, ?, ?, ?)",
        (stream, now_ms, priority, payload),
    )
    assert cur.lastrowid is not None
    return message_id(now_ms, cur.lastrowid)


# The oldest ``?`` ready jobs of each class, one partial-index range per class, in
# one statement (each ``execute`` lets go of the GIL twice: fewer is faster).
_CANDIDATES: Final = " UNION ALL ".join(
    f"SELECT * FROM (SELECT {p}, created_ms, seq FROM jobs INDEXED BY jobs_ready"  # noqa: S608 - class numbers
    f" WHERE stream = ? AND state = 'ready' AND priority = {p}"
    " ORDER BY created_ms, seq LIMIT ?)"
    for p in range(len(PRIORITIES))
)


def _candidates(conn: sqlite3.Connection, stream: str, count: int) -> list[list[Candidate]]:
    """Per class, its ``count`` oldest ready jobs, oldest first."""
    per_class: list[list[Candidate]] = [[] for _ in PRIORITIES]
    args = (stream, count) * len(PRIORITIES)
    for priority, created_ms, seq in conn.execute(_CANDIDATES, args):
        per_class[priority].append(Candidate(priority, created_ms, seq))
    return per_class


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


def claim(
    conn: sqlite3.Connection, now_ms: int, stream: str, consumer: str, count: int
) -> list[tuple[StreamMessage, str]]:
    """Lease up to ``count`` ready jobs, chosen by the aging rule, each fenced with
    its own token (a fresh random part per claim, plus the job's row)."""
    winners = _winners(_candidates(conn, stream, count), now_ms, count)
    if not winners:
        return []
    marks = ",".join("?" * len(winners))
    rows = conn.execute(
        "UPDATE jobs SET state = 'leased', token = ? || '.' || seq, consumer = ?,"  # noqa: S608 - placeholders
        " leased_ms = ?, deliveries = deliveries + 1"
        f" WHERE seq IN ({marks}) AND state = 'ready'"
        " RETURNING seq, payload, deliveries, token",
        (new_token(), consumer, now_ms, *(w.seq for w in winners)),
    ).fetchall()
    by_seq = {seq: (payload, deliveries, token) for seq, payload, deliveries, token in rows}
    leased: list[tuple[StreamMessage, str]] = []
    for w in winners:  # in the order chosen
        payload, deliveries, token = by_seq[w.seq]
        message = StreamMessage(
            id=message_id(w.created_ms, w.seq), payload=payload, deliveries=deliveries
        )
        leased.append((message, token))
    return leased


def reclaim(  # noqa: PLR0917 - every step has the (conn, now_ms) head
    conn: sqlite3.Connection,
    now_ms: int,
    stream: str,
    consumer: str,
    min_idle_ms: int,
    count: int,
) -> list[tuple[StreamMessage, str]]:
    """Take over leases idle at least ``min_idle_ms`` (a new token each: the old
    holder's token no longer fences anything)."""
    rows = conn.execute(
        "SELECT seq, created_ms FROM jobs INDEXED BY jobs_leased"
        " WHERE stream = ? AND state = 'leased' AND leased_ms <= ?"
        " ORDER BY leased_ms, seq LIMIT ?",
        (stream, now_ms - min_idle_ms, count),
    ).fetchall()
    taken: list[tuple[StreamMessage, str]] = []
    for seq, created_ms in rows:
        token = new_token()
        payload, deliveries = conn.execute(
            "UPDATE jobs SET token = ?, consumer = ?, leased_ms = ?, deliveries = deliveries + 1"
            " WHERE seq = ? RETURNING payload, deliveries",
            (token, consumer, now_ms, seq),
        ).fetchone()
        message = StreamMessage(
            id=message_id(created_ms, seq), payload=payload, deliveries=deliveries, reclaimed=True
        )
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
