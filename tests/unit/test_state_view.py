"""The functions state view: events in, one JSON row per function out, in a real
SQLite file under a temporary state directory."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from relay.adapters.sqlite.db import JSONB_SUPPORTED, db_path, open_db
from relay.adapters.sqlite.state_view import SqliteStateView
from relay.application.bus import MessageBus
from relay.domain.durations import SECOND
from relay.domain.events import (
    FunctionDiscovered,
    FunctionPrepared,
    FunctionReconcileFailed,
    FunctionRemoved,
    FunctionSummary,
    HandlerSummary,
    ScheduleSummary,
    ServiceSummary,
)
from tests.fakes_compose import deliver

pytestmark = pytest.mark.anyio

T0 = 1_789_000_000.0
FINGERPRINT = "ab" * 32
SUMMARY = FunctionSummary(
    runtime="python3.14",
    concurrency=2,
    handlers=(HandlerSummary(handler="events.created.handler", timeout_ns=6 * SECOND, retries=4),),
    schedules=(
        ScheduleSummary(
            handler="jobs.report.handler",
            cron="0 8 * * 1-5",
            timezone="Europe/Rome",
            timeout_ns=20 * SECOND,
            retries=4,
        ),
    ),
    services=(ServiceSummary(entrypoint="service.js", port=3000, replicas=2),),
    env={"API_URL": "https://api.example.com"},
    secrets={"DATABASE_URL": "database-url"},
)


def prepared(
    name: str = "fn", at: float = T0, image: str = "relay-fn-fn:abababababababab"
) -> FunctionPrepared:
    return FunctionPrepared(
        name=name,
        directory=f"/functions/{name}",
        runtime="python3.14",
        image=image,
        fingerprint=FINGERPRINT,
        dependency_image="relay-dep-python3.14:0123456789abcdef",
        built=True,
        prepared_at=at,
        summary=SUMMARY,
    )


@pytest.fixture
async def view(tmp_path: Path) -> SqliteStateView:
    view = SqliteStateView(db_path(tmp_path / "state"))
    await view.open()
    return view


def read(view: SqliteStateView, name: str) -> dict[str, object]:
    db = open_db(view.path)
    try:
        found = db.row("functions", name)
    finally:
        db.close()
    assert found is not None
    return found[0]


async def test_open_creates_the_directory_file_and_schema(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "state" / "db.sqlite3"
    view = SqliteStateView(path)
    await view.open()
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    conn.close()
    assert {"functions", "stats", "function_stats"} <= tables
    assert mode == "wal"
    await view.aclose()


async def test_prepared_writes_a_ready_row_with_the_whole_snapshot(view: SqliteStateView) -> None:
    await view.on_prepared(prepared())
    row = read(view, "fn")
    assert row["status"] == "ready"
    assert row["fingerprint"] == FINGERPRINT  # the full 64 hex
    assert row["image"] == "relay-fn-fn:abababababababab"
    assert row["prepared_at"] == "2026-09-10T00:26:40Z"
    assert row["last_reconcile_status"] == "success"
    assert "last_error" not in row
    assert row["handlers"] == [{"name": "events.created.handler", "timeout": "6s", "retries": 4}]
    assert row["schedules"] == [
        {
            "handler": "jobs.report.handler",
            "cron": "0 8 * * 1-5",
            "timezone": "Europe/Rome",
            "timeout": "20s",
            "retries": 4,
            "catchup": "0",
            "overlap": "allow",
        }
    ]
    assert row["services"] == [{"entrypoint": "service.js", "port": 3000, "replicas": 2}]
    assert row["env"] == {"API_URL": "https://api.example.com"}
    assert row["secrets"] == {"DATABASE_URL": "database-url"}


async def test_the_payload_is_stored_as_jsonb_when_sqlite_has_it(view: SqliteStateView) -> None:
    await view.on_prepared(prepared())
    conn = sqlite3.connect(view.path)
    kind = conn.execute("SELECT typeof(data) FROM functions").fetchone()[0]
    conn.close()
    assert kind == ("blob" if JSONB_SUPPORTED else "text")


async def test_a_failed_reconcile_keeps_status_ready_and_the_serving_version(
    view: SqliteStateView,
) -> None:
    await view.on_prepared(prepared())
    await view.on_failed(
        FunctionReconcileFailed(
            name="fn",
            error="build failed: exit status 1",
            at=T0 + 60,
            runtime="python3.14",
            image="relay-fn-fn:abababababababab",
            fingerprint=FINGERPRINT,
            prepared_at=T0,
            summary=SUMMARY,
        )
    )
    row = read(view, "fn")
    assert row["status"] == "ready"
    assert row["image"] == "relay-fn-fn:abababababababab"
    assert row["prepared_at"] == "2026-09-10T00:26:40Z"
    assert row["last_reconcile_status"] == "failed"
    assert row["last_reconcile_at"] == "2026-09-10T00:27:40Z"
    assert row["last_error"] == "build failed: exit status 1"


async def test_discovered_is_pending_without_image_and_a_first_failure_is_failed(
    view: SqliteStateView,
) -> None:
    await view.on_discovered(
        FunctionDiscovered(name="fn", directory="/functions/fn", summary=SUMMARY, at=T0)
    )
    row = read(view, "fn")
    assert row["status"] == "pending"
    assert "image" not in row
    assert "last_reconcile_status" not in row
    await view.on_failed(FunctionReconcileFailed(name="fn", error="no base image", at=T0 + 1))
    row = read(view, "fn")
    assert row["status"] == "failed"  # not serving; "pending" would read as "being built"
    assert row["last_error"] == "no base image"
    assert row["runtime"] == "python3.14"  # the template part survives


async def test_removed_deletes_the_row(view: SqliteStateView) -> None:
    await view.on_prepared(prepared("a"))
    await view.on_prepared(prepared("b"))
    await view.on_removed(FunctionRemoved(name="a", at=T0))
    db = open_db(view.path)
    names = [name for name, _data, _at in db.rows("functions")]
    db.close()
    assert names == ["b"]


async def test_a_deleted_database_is_recreated_and_refilled(view: SqliteStateView) -> None:
    await view.on_prepared(prepared("a"))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{view.path}{suffix}").unlink(missing_ok=True)  # noqa: ASYNC240 - test setup
    await view.on_prepared(prepared("b"))
    assert read(view, "a")["status"] == "ready"
    assert read(view, "b")["status"] == "ready"


async def test_a_broken_database_is_logged_never_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    view = SqliteStateView(blocker / "db.sqlite3")
    with capture_logs() as logs:
        await view.open()
        await view.on_prepared(prepared())
    assert {entry["event"] for entry in logs} >= {"state_db_unavailable", "state_view_write_failed"}


async def test_start_clears_rows_of_the_previous_process(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    first = SqliteStateView(path)
    await first.open()
    await first.on_prepared(prepared("gone"))
    await first.aclose()
    second = SqliteStateView(path)
    assert await second.open() == ["gone"]
    db = open_db(path)
    assert db.rows("functions") == []
    db.close()


async def test_subscribes_to_the_lifecycle_events_on_the_bus(view: SqliteStateView) -> None:
    bus = MessageBus({})
    view.subscribe(bus)
    await deliver(bus, [prepared("fn")])
    assert read(view, "fn")["status"] == "ready"
