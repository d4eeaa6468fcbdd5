"""A handler that says when it started (wall clock, ms), then sleeps: the lease test
compares that instant with the claim's deadline in Redis (same host clock)."""

from __future__ import annotations

import time
from typing import Any


def sleep(event: dict[str, Any]) -> None:
    print(f"STARTED {time.time_ns() // 1_000_000}")
    time.sleep(event["s"])
