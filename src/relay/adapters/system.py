"""Real clock and token source."""

from __future__ import annotations

import secrets
import time


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class RandomTokenSource:
    def token(self) -> str:
        return secrets.token_hex(8)
