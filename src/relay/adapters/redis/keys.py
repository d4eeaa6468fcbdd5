"""Redis key names Relay owns for one stream and group.

Stream and group names are percent-encoded inside the ledger key so a ``:`` in a
name can never make two keys collide.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

from redis.exceptions import RedisError

from relay.domain.errors import DependencyUnavailable


@functools.lru_cache(maxsize=64)
def _enc(name: str) -> str:
    # Stream and group names are few and fixed: percent-encode each once.
    return quote(name, safe="")


def invocation_key(stream: str, group: str, message_id: str) -> str:
    """The ledger hash of one message: ``relay:invocation:{stream}:{group}:{msgID}``."""
    return f"relay:invocation:{_enc(stream)}:{_enc(group)}:{message_id}"


def dlq_key(stream: str) -> str:
    """The dead-letter stream of ``stream``: ``relay:<stream>:dlq``."""
    return f"relay:{stream}:dlq"


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Driver errors as :class:`DependencyUnavailable` (one line, cause kept)."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise DependencyUnavailable(f"redis {what} failed: {exc}") from exc


def delayed_key(stream: str) -> str:
    """The due-time sorted set of ``stream``'s delayed events: ``relay:<stream>:delayed``
    (members are delayed ids, scores their due time in ms)."""
    return f"relay:{stream}:delayed"


def delayed_events_key(stream: str) -> str:
    """The bodies of the delayed events: ``relay:<stream>:delayed:events``
    (a hash, delayed id -> event)."""
    return f"relay:{stream}:delayed:events"


def delayed_seq_key(stream: str) -> str:
    """The counter numbering delayed ids: ``relay:<stream>:delayed:seq``."""
    return f"relay:{stream}:delayed:seq"
