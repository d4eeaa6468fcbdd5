"""``relay publish``'s delivery options: ``--delay`` / ``--at`` and ``--id``.

Each is checked before anything is read or written, and a bad one is one usage
line (exit 2). The rules themselves (the bound on a delay, a key's alphabet) are
:mod:`relay.domain.publication`'s, the same for HTTP ingest.
"""

from __future__ import annotations

import time

from relay.domain.durations import MILLISECOND, DurationError, parse_setting_duration
from relay.domain.publication import InvalidPublication, check_delay, check_key, parse_time
from relay.entrypoints.cli.common import usage


def publish_options(
    delay: str | None, at: str | None, key: str | None, *, single: bool
) -> tuple[int | None, str | None]:
    """``(deliver_at_ms, idempotency_key)`` from the flags. ``single``: the command
    line names one event (``--event`` without ``--count`` above 1): a key names
    one event, so with several (``--count``, stdin) it is refused rather than
    guessed at (one key for all would publish the first only)."""
    if delay is not None and at is not None:
        usage("--delay and --at exclude each other: give one")
    if key is not None and not single:
        usage("--id names one event: use it with --event, without --count or stdin")
    deliver_at = _deliver_at(delay, at, time.time_ns() // MILLISECOND)
    if key is not None:
        try:
            check_key(key)
        except InvalidPublication as exc:
            usage(f"--id: {exc}")
    return deliver_at, key


def _deliver_at(delay: str | None, at: str | None, now_ms: int) -> int | None:
    flag, text = ("--delay", delay) if delay is not None else ("--at", at)
    if text is None:
        return None
    try:
        deliver_at = now_ms + _delay_ms(text) if delay is not None else parse_time(text)
        check_delay(deliver_at, now_ms)
    except InvalidPublication as exc:
        usage(f"{flag}: {exc}")
    return deliver_at


def _delay_ms(text: str) -> int:
    try:
        ns = parse_setting_duration(text)
    except DurationError:
        raise InvalidPublication(f"{text[:40]!r} is not a duration such as 10m or 2h30m") from None
    if ns < 0:
        raise InvalidPublication(f"{text[:40]!r} is negative: a delay is 0s or more")
    return ns // MILLISECOND

