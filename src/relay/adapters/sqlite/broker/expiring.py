"""The ``occurrences`` table's expiry: rows that say "this was published" for a
while (schedule occurrences and publish idempotency keys alike).

A module of its own, free of the schedule rules, so ``relay publish`` can prune
the table without importing croniter and the template model (start-up stays
light: docs/cli.md, Startup)."""

from __future__ import annotations

import sqlite3
from typing import Final

EXPIRED_BATCH: Final = 100  # expired rows deleted per publish at most


def delete_expired(conn: sqlite3.Connection, now_ms: int) -> None:
    """Rows past their expiry, ``EXPIRED_BATCH`` at most: each publish that writes a
    row deletes as many, so the table stays bounded by what is live."""
    conn.execute(
        "DELETE FROM occurrences WHERE id IN (SELECT id FROM occurrences"
        " WHERE expires_ms <= ? LIMIT ?)",
        (now_ms, EXPIRED_BATCH),
    )
