"""What each page shows, as plain values for the templates (no HTTP here).

The overview's series come from the per-minute rollups; the functions from the
state database's ``functions`` rows (what ``relay function ls`` reads) with the
serving template's schedules and this worker's breakers; everything else from
:mod:`reads` and the run history.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from relay.adapters.sqlite.db import StateDatabase
from relay.adapters.sqlite.run_history import RollupRow, rollup_rows
from relay.application.registry import FunctionRegistry
from relay.domain import events as ev
from relay.domain import schedule
from relay.domain.execution import PoolSnapshot
from relay.domain.run_history import ALL

WINDOWS = {"hour": 3600, "day": 86400}


def chart_series(rows: list[RollupRow], *, since: float, now: float) -> dict[str, list[Any]]:
    """uPlot's columns, one point per minute from ``since`` (empty minutes are 0)."""
    by_minute = {row.minute: row for row in rows}
    first, last = int(since // 60) * 60, int(now // 60) * 60
    out: dict[str, list[Any]] = {k: [] for k in
                                 ("t", "events_s", "failed", "dead", "p50_ms", "p99_ms")}
    for minute in range(first, last + 60, 60):
        row = by_minute.get(minute)
        out["t"].append(minute)
        out["events_s"].append(round(row.received / 60, 3) if row else 0)
        out["failed"].append(row.failed if row else 0)
        out["dead"].append(row.dead_lettered if row else 0)
        out["p50_ms"].append(_ms(row.p50_s) if row else None)
        out["p99_ms"].append(_ms(row.p99_s) if row else None)
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def overview_charts(db: StateDatabase, now: float | None = None) -> str:
    """The JSON the overview's script draws: both windows (blocking)."""
    now = time.time() if now is None else now
    charts = {}
    for name, span in WINDOWS.items():
        since = now - span
        rows = rollup_rows(db, since=since, function=ALL)
        charts[name] = chart_series(rows, since=since, now=now)
    # "</" never appears in the JSON text placed inside <script>: no early end tag
    return json.dumps(charts).replace("</", "<\\/")


def totals(db: StateDatabase, now: float | None = None) -> dict[str, int]:
    now = time.time() if now is None else now
    rows = rollup_rows(db, since=now - 3600, function=ALL)
    return {
        "received": sum(r.received for r in rows),
        "succeeded": sum(r.succeeded for r in rows),
        "failed": sum(r.failed for r in rows),
        "dead_lettered": sum(r.dead_lettered for r in rows),
    }


@dataclass
class Breakers:
    """This worker's breakers that are not closed, from the bus."""

    state: dict[str, str] = field(default_factory=dict)

    def subscribe(self, bus: Any) -> None:
        bus.subscribe(ev.BreakerOpened, lambda e: self.state.__setitem__(e.function, "open"))
        bus.subscribe(ev.BreakerHalfOpened,
                      lambda e: self.state.__setitem__(e.function, "half-open"))
        bus.subscribe(ev.BreakerClosed, lambda e: self.state.pop(e.function, None))
        bus.subscribe(ev.FunctionRemoved, lambda e: self.state.pop(e.name, None))

    @property
    def open(self) -> list[str]:
        return sorted(self.state)


def pool_text(snapshot: PoolSnapshot | None, concurrency: object) -> str:
    """``2 busy, 1 idle of 4`` (live), else the template's concurrency."""
    if snapshot is None:
        return f"up to {concurrency}" if concurrency is not None else "-"
    text = f"{snapshot.busy} busy, {snapshot.idle} idle of {snapshot.capacity}"
    return text + (f", {snapshot.starting} starting" if snapshot.starting else "")


def function_rows(
    db: StateDatabase,
    registry: FunctionRegistry,
    breakers: Breakers,
    now: float,
    pools: dict[str, PoolSnapshot] | None = None,
) -> list[dict[str, Any]]:
    """One dict per function of the state view, with schedule times, pool and breaker."""
    out = []
    pools = pools or {}
    for name, data, _at in db.rows("functions"):
        active = registry.get(name)
        rules = {r.handler: r for r in active.template.schedules} if active else {}
        schedules = []
        for s in data.get("schedules", []):
            rule = rules.get(s.get("handler", ""))
            last = schedule.latest_firing(rule, int(now), 7 * 86400) if rule else None
            schedules.append({
                **s,
                "last": schedule.instant(last) if last else "-",
                "next": schedule.instant(schedule.next_firing(rule, int(now))) if rule else "-",
            })
        fingerprint = data.get("fingerprint") or ""
        out.append({
            "name": name,
            "status": data.get("status", "-"),
            "why": data.get("last_error", ""),
            "version": fingerprint[:12] or "-",
            "image": data.get("image", "-"),
            "pool": pool_text(pools.get(name), data.get("concurrency")),
            "runtime": data.get("runtime") or "-",
            "breaker": breakers.state.get(name, "closed"),
            "handlers": [h.get("name") for h in data.get("handlers", [])],
            "schedules": schedules,
        })
    return out
