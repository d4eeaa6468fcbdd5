"""Reading an embedded broker's file directly, as the tests check what it holds."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any


def rows(path: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """The rows ``sql`` selects from the broker file at ``path`` (its own connection)."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()
