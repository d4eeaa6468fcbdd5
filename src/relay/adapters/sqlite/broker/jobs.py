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


def _candidates(conn: sqlite3.Connection, stream: str) -> list[Candidate]:
    """The oldest ready job of each class: four lookups on the partial index."""
    found: list[Candidate] = []
    for priority in range(len(PRIORITIES)):
        row = conn.execute(
            "SELECT created_ms, seq FROM jobs INDEXED BY jobs_ready"
            " WHERE stream = ? AND state = 'ready' AND priority = ?"
            " ORDER BY created_ms, seq LIMIT 1",
            (stream, priority),
        ).fetchone()
        if row is not None:
            found.append(Candidate(priority, row[0], row[1]))
    return found


def claim(
    conn: sqlite3.Connection, now_ms: int, stream: str, consumer: str, count: int
) -> list[tuple[StreamMessage, str]]:
    """Lease up to ``count`` ready jobs, each chosen by the aging rule and fenced
    with a fresh token; ``(message, token)`` pairs."""
    leased: list[tuple[StreamMessage, str]] = []
    for _ in range(count):
        winner = choose(_candidates(conn, stream), now_ms)
        if winner is None:
            break
        token = new_token()
        row = conn.execute(
            "UPDATE jobs SET state = 'leased', token = ?, consumer = ?, leased_ms = ?,"
            " deliveries = deliveries + 1 WHERE seq = ? AND state = 'ready'"
            " RETURNING payload, deliveries",
            (token, consumer, now_ms, winner.seq),
        ).fetchone()
        payload, deliveries = row
        leased.append(
            (
                StreamMessage(
                    id=message_id(winner.created_ms, winner.seq),
                    payload=payload,
                    deliveries=deliveries,
                ),
                token,
            )
        )
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
