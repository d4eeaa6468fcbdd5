"""``relay function ls --json`` and ``relay function inspect --json``.

The same rows the text renders, as data: instants stay the stored RFC3339 UTC
strings, absent values are ``null`` (never left out), counters are integers. The
shapes are ``docs/schemas/function.ls.v1.json`` and ``function.inspect.v1.json``.
Secret REFERENCES are shown (as in the text), never values: the row holds none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from relay.domain.stats import FUNCTION_TIMESTAMPS
from relay.entrypoints.cli.breaker_view import breaker_document
from relay.entrypoints.cli.fire_times import next_fire_at

_STATS = ("events_matched", "handler_success", "handler_failure", "retries", "dlq_entries")
_POOL_LIVE = ("capacity", "containers", "busy", "idle", "starting")
_POOL_COUNTERS = ("warm_acquires", "cold_starts", "discarded")


def ls_document(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``relay.function.ls/1``: every function, sorted by name."""
    functions = [
        {
            "name": str(row.get("name", "")),
            "runtime": row.get("runtime") or None,
            "status": str(row.get("status", "pending")),
            "updated_at": row.get("prepared_at") or row.get("updated_at") or None,
        }
        for row in sorted(rows, key=lambda r: str(r.get("name", "")))
    ]
    return {"functions": functions}


def inspect_document(
    row: Mapping[str, Any],
    stats: Mapping[str, Any],
    pool: Mapping[str, Any] | None,
    breaker: Mapping[str, Any] | None,
    now: float,
) -> dict[str, Any]:
    """``relay.function.inspect/1``: one function, every section of the text;
    ``pool`` and ``breaker`` are the live worker's (``None``: no worker answered)."""
    ready = row.get("status") == "ready"
    outcome = row.get("last_reconcile_status")
    return {
        "name": str(row.get("name", "")),
        "runtime": row.get("runtime") or None,
        "status": str(row.get("status", "pending")),
        "image": (row.get("image") or None) if ready else None,
        "fingerprint": (row.get("fingerprint") or None) if ready else None,
        "prepared_at": (row.get("prepared_at") or None) if ready else None,
        "last_reconcile": None
        if not outcome
        else {"status": str(outcome), "at": row.get("last_reconcile_at") or None},
        "last_error": row.get("last_error") or None,
        "events": [_event(h) for h in row.get("handlers") or []],
        "schedules": [_schedule(s, now) for s in row.get("schedules") or []],
        "services": [
            _service(s, row.get("service_state") or {}) for s in row.get("services") or []
        ],
        "stats": {
            **{key: _int(stats.get(key)) for key in _STATS},
            **{key: _text(stats.get(key)) for key in FUNCTION_TIMESTAMPS},
        },
        "env": {str(k): str(v) for k, v in sorted((row.get("env") or {}).items())},
        "secrets": {str(k): str(v) for k, v in sorted((row.get("secrets") or {}).items())},
        "pool": {
            "live": None if pool is None else {key: _int(pool.get(key)) for key in _POOL_LIVE},
            **{key: _int(stats.get(key)) for key in _POOL_COUNTERS},
        },
        "breaker": breaker_document(breaker),
    }


def _event(handler: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "handler": str(handler.get("name", "")),
        "timeout": str(handler.get("timeout") or "6s"),
        "retries": _int(handler.get("retries", 4)),
    }


def _schedule(s: Mapping[str, Any], now: float) -> dict[str, Any]:
    cron, zone = str(s.get("cron", "")), str(s.get("timezone") or "UTC")
    return {
        "handler": str(s.get("handler", "")),
        "cron": cron,
        "timezone": zone,
        "timeout": str(s.get("timeout") or "6s"),
        "retries": _int(s.get("retries", 4)),
        "catchup": str(s.get("catchup") or "0"),
        "overlap": str(s.get("overlap") or "allow"),
        "next_at": next_fire_at(cron, zone, now),
    }


def _service(s: Mapping[str, Any], state: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    kind = next((k for k in ("entrypoint", "build", "image") if s.get(k)), "entrypoint")
    source = str(s.get(kind, ""))
    known = state.get(source) or {}
    return {
        "kind": kind,
        "source": source,
        "host": s.get("host") or None,
        "path": s.get("path") or None,
        "port": _int(s.get("port", 80)),
        "replicas": _int(s.get("replicas", 1)),
        "replica_states": [str(r) for r in known.get("replicas") or []],
        "rule": known.get("rule") or None,
        "error": known.get("error") or None,
    }


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
