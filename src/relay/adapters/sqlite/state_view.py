"""The ``functions`` table as a projection of the function lifecycle events.

One row per function holding one JSON snapshot: status (``ready`` once a version
serves, ``pending`` while the first one is being prepared, ``failed`` when no
version serves and the last reconcile failed: an invalid template or a failed
first build, its reason in ``last_error``), runtime, image, full fingerprint, when
it was prepared, the last meaningful reconcile outcome and error, and what the
template declares (handlers, schedules, services, env values and secret
REFERENCES, never secret values). It only observes: nothing reads it back to
decide behaviour, and every database error is logged and swallowed, so Relay
runs on when the file is missing, locked or broken. A deleted file is recreated
and refilled from the rows this process already knows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import msgspec
import structlog

from relay.adapters.sqlite.db import StateDatabase, open_db, rfc3339
from relay.application.bus import MessageBus
from relay.domain.durations import format_duration
from relay.domain.events import (
    FunctionDiscovered,
    FunctionPrepared,
    FunctionReconcileFailed,
    FunctionRemoved,
    FunctionSummary,
    ServicesConverged,
)

_log = structlog.get_logger(__name__)

TABLE = "functions"
READY, PENDING, FAILED = "ready", "pending", "failed"


def summary_fields(summary: FunctionSummary) -> dict[str, Any]:
    """The template part of a row, in the stored JSON shape."""
    return {
        "runtime": summary.runtime,
        "concurrency": summary.concurrency,
        "handlers": [
            {"name": h.handler, "timeout": format_duration(h.timeout_ns), "retries": h.retries}
            for h in summary.handlers
        ],
        "schedules": [
            {
                "handler": s.handler,
                "cron": s.cron,
                "timezone": s.timezone,
                "timeout": format_duration(s.timeout_ns),
                "retries": s.retries,
                "catchup": format_duration(s.catchup_ns) if s.catchup_ns else "0",
                "overlap": s.overlap,
            }
            for s in summary.schedules
        ],
        "services": [
            {k: v for k, v in msgspec.to_builtins(s).items() if v is not None}
            for s in summary.services
        ],
        "env": dict(summary.env),
        "secrets": dict(summary.secrets),
    }


class SqliteStateView:
    """Subscriber writing the ``functions`` rows; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: StateDatabase | None = None
        self._rows: dict[str, dict[str, Any]] = {}

    def subscribe(self, bus: MessageBus) -> None:
        """Register for the four lifecycle events on ``bus``."""
        bus.subscribe(FunctionDiscovered, self.on_discovered)
        bus.subscribe(FunctionPrepared, self.on_prepared)
        bus.subscribe(FunctionReconcileFailed, self.on_failed)
        bus.subscribe(FunctionRemoved, self.on_removed)
        bus.subscribe(ServicesConverged, self.on_services)

    async def open(self) -> list[str]:
        """Open the database and clear the previous process's rows: the startup
        reconcile rebuilds them, so a function deleted while Relay was down does
        not linger. Returns the names those rows had (for the reconciler's
        startup cleanup of images left by functions deleted meanwhile)."""
        return await anyio.to_thread.run_sync(self._open_and_clear)

    async def aclose(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await anyio.to_thread.run_sync(db.close)

    # --- event handlers -------------------------------------------------------
    async def on_discovered(self, event: FunctionDiscovered) -> None:
        previous = self._rows.get(event.name, {})
        row = {
            **_last_reconcile(previous),
            **summary_fields(event.summary),
            "name": event.name,
            "directory": event.directory,
            "status": PENDING,
        }
        await self._write(event.name, row, event.at)

    async def on_prepared(self, event: FunctionPrepared) -> None:
        previous = self._rows.get(event.name, {})
        row = {
            "service_state": previous.get("service_state"),
            **summary_fields(event.summary),
            "name": event.name,
            "directory": event.directory,
            "status": READY,
            "runtime": event.runtime,
            "image": event.image,
            "fingerprint": event.fingerprint,
            "dependency_image": event.dependency_image,
            "prepared_at": rfc3339(event.prepared_at),
            "last_reconcile_status": "success",
            "last_reconcile_at": rfc3339(event.at or event.prepared_at),
        }
        await self._write(event.name, row, event.at or event.prepared_at)

    async def on_failed(self, event: FunctionReconcileFailed) -> None:
        row = dict(self._rows.get(event.name, {"name": event.name}))
        if event.summary is not None:
            row.update(summary_fields(event.summary))
        if event.image is not None:
            row.update(
                status=READY,
                runtime=event.runtime,
                image=event.image,
                fingerprint=event.fingerprint,
                prepared_at=rfc3339(event.prepared_at) if event.prepared_at else None,
            )
        else:
            # Nothing serves: not "pending", which reads as "about to be built";
            # it waits for a change (or the periodic pass) to try again.
            row["status"] = FAILED
            for key in ("image", "fingerprint", "prepared_at", "dependency_image"):
                row.pop(key, None)
        row.update(
            last_reconcile_status="failed",
            last_reconcile_at=rfc3339(event.at),
            last_error=event.error,
        )
        await self._write(event.name, row, event.at)

    async def on_services(self, event: ServicesConverged) -> None:
        """Each service's replica states and effective rule (``inspect`` shows them)."""
        row = self._rows.get(event.name)
        if row is None:
            return
        row = dict(row)
        row["service_state"] = {
            s.identity: {
                "replicas": [r.state for r in s.replicas],
                **({"rule": s.rule} if s.rule else {}),
                **({"error": s.error} if s.error else {}),
            }
            for s in event.services
        }
        await self._write(event.name, row, event.at)

    async def on_removed(self, event: FunctionRemoved) -> None:
        self._rows.pop(event.name, None)
        await self._run(lambda db: db.delete(TABLE, event.name), "state_view_delete_failed")

    # --- storage --------------------------------------------------------------
    async def _write(self, name: str, row: dict[str, Any], at: float) -> None:
        row = {key: value for key, value in row.items() if value is not None}
        row["updated_at"] = rfc3339(at)
        self._rows[name] = row
        await self._run(
            lambda db: db.upsert(TABLE, name, row, rfc3339(at)), "state_view_write_failed"
        )

    async def _run(self, action: Callable[[StateDatabase], None], failure: str) -> None:
        try:
            await anyio.to_thread.run_sync(self._with_db, action)
        except (sqlite3.Error, OSError) as exc:
            # Never fatal: the view is for operators; drop the handle and retry later.
            _log.warning(failure, path=str(self.path), error=str(exc))
            self._db = None

    def _with_db(self, action: Callable[[StateDatabase], None]) -> None:
        if self._db is None or not self.path.exists():
            self._reopen()
        assert self._db is not None
        action(self._db)

    def _reopen(self) -> None:
        """(Re)create the database and refill it from the rows already known."""
        if self._db is not None:
            self._db.close()
            self._db = None
        db = open_db(self.path)
        for name, row in self._rows.items():
            db.upsert(TABLE, name, row, row.get("updated_at", ""))
        self._db = db
        _log.info("state_db_opened", path=str(self.path), functions=len(self._rows))

    def _open_and_clear(self) -> list[str]:
        try:
            self._reopen()
            assert self._db is not None
            previous = [name for name, _data, _at in self._db.rows(TABLE)]
            with self._db.transaction() as conn:
                conn.execute(f"DELETE FROM {TABLE}")  # noqa: S608 - fixed table name
        except (sqlite3.Error, OSError) as exc:
            _log.warning("state_db_unavailable", path=str(self.path), error=str(exc))
            self._db = None
            return []
        return previous


def _last_reconcile(row: dict[str, Any]) -> dict[str, Any]:
    """Keep the previous reconcile outcome while a function goes back to pending."""
    keys = ("last_reconcile_status", "last_reconcile_at", "last_error")
    return {key: row[key] for key in keys if key in row}
