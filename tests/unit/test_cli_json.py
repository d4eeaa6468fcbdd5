"""``--json`` on the read commands that need no Redis or Docker: each document is
checked against its schema file (tests/json_schemas.py), empty and error cases too.

The commands run as typer apps in this process against real files in a temporary
state directory (the state database, the secret store, the git files).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from relay.adapters.fs.secrets import FileSecretStore
from relay.adapters.sqlite.db import db_path, open_db, rfc3339
from relay.adapters.sqlite.stats_store import write_stats
from relay.domain.events import FunctionReconcileFailed
from relay.domain.message_facts import DeadLetterFact, MessageFacts
from relay.domain.stats import StatsSnapshot
from relay.entrypoints.cli import app
from relay.entrypoints.cli.fn_catalog_json import inspect_document
from relay.entrypoints.cli.trace_json import trace_document
from tests.json_schemas import SCHEMAS, assert_matches_schema, load_schema
from tests.unit.test_catalog_cli import _row_from_view, prepared

JSON_COMMANDS = [
    ["function", "ls"],
    ["function", "inspect", "user-events-python"],
    ["stats"],
    ["trace", "1-0"],
    ["health"],
    ["schedule", "ls"],
    ["git", "status"],
    ["secret", "ls"],
    ["function", "run", "fn", "mod.handler", "--event", "{}"],
    ["function", "invoke", "fn", "--event", "{}"],
]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        "RELAY_STATE_DIR": str(tmp_path / "state"),
        "RELAY_RUN_DIR": str(tmp_path / "run"),
        # nothing here may reach a real Redis: the address refuses connections
        "REDIS_URI": "127.0.0.1:1",
        "REDIS_STREAM": "events",
        "REDIS_GROUP": "relay",
    }


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


def _state_with_a_function(env: dict[str, str]) -> Path:
    state = Path(env["RELAY_STATE_DIR"])
    _row_from_view(state, prepared("user-events-python", "python3.14", time.time() - 125))
    db = open_db(db_path(state))
    db.upsert(
        "function_stats",
        "user-events-python",
        {"events_matched": 5, "cold_starts": 1, "last_success_at": "2026-09-10T00:00:00Z"},
        "x",
    )
    db.close()
    return state


# --- every schema file is a valid, strict 2020-12 schema ------------------------------
def test_every_schema_file_is_strict_and_names_its_own_kind() -> None:
    files = sorted(SCHEMAS.glob("*.v1.json"))
    assert files
    for path in files:
        kind = path.name.removesuffix(".v1.json")
        schema = load_schema(kind, 1)
        assert schema["properties"]["schema"] == {
            "const": f"relay.{kind}/1",
            "description": "Names this shape and its version.",
        }

        def strict(node: object, where: str, path: Path = path) -> None:
            if isinstance(node, dict):
                if node.get("type") == "object" and "properties" in node:
                    assert node.get("additionalProperties") is False, f"{path.name}: {where}"
                    assert sorted(node["required"]) == sorted(node["properties"]), (
                        f"{path.name}: {where} leaves a property optional"
                    )
                for key, value in node.items():
                    strict(value, f"{where}/{key}", path)
            elif isinstance(node, list):
                for i, value in enumerate(node):
                    strict(value, f"{where}/{i}", path)

        strict(schema, "")


def test_a_drifted_document_fails_its_schema() -> None:
    """The check is strict: an extra, a missing or a retyped field each fail."""
    good = {"schema": "relay.secret.ls/1", "secrets": ["a"]}
    assert_matches_schema(json.dumps(good))
    for bad in (
        {**good, "extra": 1},
        {"schema": "relay.secret.ls/1"},
        {**good, "secrets": "a"},
        {**good, "schema": "relay.secret.ls/2"},
    ):
        with pytest.raises(Exception):  # noqa: B017, PT011 - jsonschema's or a missing file's
            assert_matches_schema(json.dumps(bad))


@pytest.mark.parametrize("command", JSON_COMMANDS, ids=" ".join)
def test_json_is_a_flag_and_refuses_a_value(env: dict[str, str], command: list[str]) -> None:
    result = run(env, *command, "--json=yes")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "does not take a value" in result.stderr
    assert "Traceback" not in result.output


# --- function ls / inspect -----------------------------------------------------------
def test_function_ls_json_of_nothing_is_an_empty_list(env: dict[str, str]) -> None:
    result = run(env, "function", "ls", "--json")
    assert result.exit_code == 0, result.output
    assert assert_matches_schema(result.stdout) == {
        "schema": "relay.function.ls/1",
        "functions": [],
    }


def test_function_ls_and_inspect_json_read_the_database(env: dict[str, str]) -> None:
    _state_with_a_function(env)
    listed = run(env, "function", "ls", "--json")
    assert listed.exit_code == 0, listed.output
    [fn] = assert_matches_schema(listed.stdout)["functions"]
    assert fn["name"] == "user-events-python"
    assert fn["runtime"] == "python3.14"
    assert fn["status"] == "ready"

    shown = run(env, "function", "inspect", "user-events-python", "--json")
    assert shown.exit_code == 0, shown.output
    doc = assert_matches_schema(shown.stdout)
    assert doc["events"][1] == {"handler": "events.updated.handler", "timeout": "20s", "retries": 4}
    assert doc["schedules"][1]["timezone"] == "Europe/Rome"
    assert doc["schedules"][1]["next_at"].endswith("Z")
    assert doc["stats"]["events_matched"] == 5
    assert doc["stats"]["last_success_at"] == "2026-09-10T00:00:00Z"
    assert doc["stats"]["last_failure_at"] is None
    assert doc["pool"] == {"live": None, "warm_acquires": 0, "cold_starts": 1, "discarded": 0}
    assert doc["last_reconcile"]["status"] == "success"


def test_function_inspect_json_of_an_unknown_function_is_one_line_and_no_document(
    env: dict[str, str],
) -> None:
    result = run(env, "function", "inspect", "nope", "--json")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == 'relay: function "nope" not found\n'


def test_function_inspect_document_covers_services_env_secrets_and_a_live_pool() -> None:
    row = {
        "name": "web",
        "status": "pending",
        "runtime": None,
        "services": [
            {"image": "nginx:1.27", "host": "a.example.com", "port": 8080, "replicas": 2},
            {"entrypoint": "main.py"},
        ],
        "service_state": {"nginx:1.27": {"replicas": ["running", "starting"], "rule": "Host(`a`)"}},
        "env": {"B": "2", "A": "1"},
        "secrets": {"DATABASE_URL": "database-url"},
        "last_reconcile_status": "failed",
        "last_reconcile_at": rfc3339(1_789_000_000),
        "last_error": "boom",
    }
    pool = {"capacity": 4, "containers": 2, "busy": 1, "idle": 1}
    breaker = {"state": "open", "enabled": True, "forced": False, "failures": 0,
               "cooldown_s": 60.0, "probe_in_s": 12.5}  # fmt: skip
    document = inspect_document(row, {}, pool, breaker, 1_789_000_000)
    doc = {"schema": "relay.function.inspect/1", **document}
    assert_matches_schema(json.dumps(doc))
    assert doc["breaker"] == breaker
    without_worker = inspect_document(row, {}, None, None, 1_789_000_000)
    assert without_worker["breaker"] is None
    assert without_worker["pool"]["live"] is None
    assert_matches_schema(json.dumps({"schema": "relay.function.inspect/1", **without_worker}))
    assert doc["image"] is None
    assert doc["services"][0]["kind"] == "image"
    assert doc["services"][0]["replica_states"] == ["running", "starting"]
    assert doc["services"][1] == {
        "kind": "entrypoint", "source": "main.py", "host": None, "path": None, "port": 80,
        "replicas": 1, "replica_states": [], "rule": None, "error": None,
    }  # fmt: skip
    assert list(doc["env"]) == ["A", "B"]
    assert doc["pool"]["live"] == {"capacity": 4, "containers": 2, "busy": 1, "idle": 1,
                                   "starting": 0}  # fmt: skip
    assert doc["last_error"] == "boom"


# --- stats --------------------------------------------------------------------------
def test_stats_json_of_a_fresh_state_is_zeros_and_never_updated(env: dict[str, str]) -> None:
    result = run(env, "stats", "--json")
    assert result.exit_code == 0, result.output
    doc = assert_matches_schema(result.stdout)
    assert doc["updated_at"] is None
    assert {v for k, v in doc.items() if k not in ("schema", "updated_at")} == {0}


def test_stats_json_reads_the_persisted_snapshot(env: dict[str, str]) -> None:
    state = Path(env["RELAY_STATE_DIR"])
    state.mkdir(parents=True)
    db = open_db(db_path(state))
    write_stats(
        db, StatsSnapshot(totals={"events_received": 7, "pending_entries": 2}), 1_000_000_000
    )
    db.close()
    result = run(env, "stats", "--json")
    assert result.exit_code == 0, result.output
    doc = assert_matches_schema(result.stdout)
    assert doc["events_received"] == 7
    assert doc["pending_entries"] == 2
    assert doc["updated_at"] == "2001-09-09T01:46:40Z"


def test_stats_json_before_reset_is_a_usage_error(env: dict[str, str]) -> None:
    result = run(env, "stats", "--json", "reset")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "--json applies to `relay stats`" in result.stderr


# --- secret ls ----------------------------------------------------------------------
def test_secret_ls_json_lists_names_never_values(env: dict[str, str]) -> None:
    Path(env["RELAY_STATE_DIR"]).mkdir()  # a missing one is an error (row 233)
    empty = run(env, "secret", "ls", "--json")
    assert empty.exit_code == 0, empty.output
    assert assert_matches_schema(empty.stdout)["secrets"] == []
    store = FileSecretStore(Path(env["RELAY_STATE_DIR"]) / "secrets")
    store.set("db-url", "canary-51c2")
    store.set("api-key", "canary-51c3")
    listed = run(env, "secret", "ls", "--json")
    assert assert_matches_schema(listed.stdout)["secrets"] == ["api-key", "db-url"]
    assert "canary" not in listed.output


# --- git status ---------------------------------------------------------------------
def test_git_status_json_without_and_with_a_source(env: dict[str, str]) -> None:
    bare = run(env, "git", "status", "--json")
    assert bare.exit_code == 0, bare.output
    assert assert_matches_schema(bare.stdout) == {
        "schema": "relay.git.status/1",
        "configured": False,
        "source": None,
        "deploy_key": {"present": False, "fingerprint": None},
        "checkout": {"present": False, "commit": None},
        "last_sync": None,
    }
    assert run(env, "git", "keygen").exit_code == 0
    assert run(env, "git", "set", "git@example.com:acme/repo.git", "--path", "fns").exit_code == 0
    shown = run(env, "git", "status", "--json")
    doc = assert_matches_schema(shown.stdout)
    assert doc["source"] == {
        "repository": "git@example.com:acme/repo.git",
        "ref": "main",
        "path": "fns",
        "webhook_secret": None,
    }
    assert doc["deploy_key"]["present"] is True
    assert doc["deploy_key"]["fingerprint"].startswith("SHA256:")
    private = (Path(env["RELAY_STATE_DIR"]) / "ssh" / "id_ed25519").read_text()
    body = "".join(line for line in private.splitlines() if "-----" not in line)
    assert body[:40] not in shown.stdout


def test_git_status_json_of_a_corrupt_source_is_one_line(env: dict[str, str]) -> None:
    source = Path(env["RELAY_STATE_DIR"]) / "git" / "source.json"
    source.parent.mkdir(parents=True)
    source.write_text("{not json")
    result = run(env, "git", "status", "--json")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("relay: ")
    assert result.stderr.count("\n") == 1


# --- health (no Docker reached: the broker check fails first) -------------------------
def test_health_json_when_unhealthy_is_a_document_and_exit_1(
    env: dict[str, str], tmp_path: Path
) -> None:
    env = {**env, "RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(tmp_path / "none.db")}
    result = run(env, "health", "--json")
    assert result.exit_code == 1
    doc = assert_matches_schema(result.stdout)
    assert doc["ok"] is False
    assert "does not exist" in doc["problem"]
    assert doc["git"] is None
    assert result.stderr == f"relay: {doc['problem']}\n"
    assert run(env, "git", "set", "git@example.com:acme/repo.git").exit_code == 0
    with_git = assert_matches_schema(run(env, "health", "--json").stdout)
    assert with_git["git"] == {"commit": None, "last_sync": None, "error": None}
    (Path(env["RELAY_STATE_DIR"]) / "git" / "source.json").write_text("{not json")
    broken = assert_matches_schema(run(env, "health", "--json").stdout)
    assert broken["git"]["error"]


# --- schedule ls (Redis refuses: the occurrences are unknown, the rest prints) --------
def test_schedule_ls_json_empty_and_with_redis_down(env: dict[str, str]) -> None:
    empty = run(env, "schedule", "ls", "--json")
    assert empty.exit_code == 0, empty.output
    assert assert_matches_schema(empty.stdout) == {
        "schema": "relay.schedule.ls/1",
        "schedules": [],
        "last_published_error": None,
    }
    _state_with_a_function(env)
    down = run(env, "schedule", "ls", "--json")
    assert down.exit_code == 0, down.output
    doc = assert_matches_schema(down.stdout)
    assert [(s["function"], s["handler"]) for s in doc["schedules"]] == [
        ("user-events-python", "jobs.cleanup.handler"),
        ("user-events-python", "jobs.report.handler"),
    ]
    assert all(s["last_published"] is None for s in doc["schedules"])
    assert doc["last_published_error"].startswith("last published occurrences unknown: ")


# --- trace on the embedded broker (a real file; no Redis) ----------------------------
def test_trace_json_of_an_unknown_message_on_the_embedded_broker(
    env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "broker.db"
    env = {**env, "RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(path)}
    assert run(env, "publish", "--event", '{"k": 1}').exit_code == 0
    result = run(env, "trace", "1-0", "--json")
    assert result.exit_code == 0, result.output
    doc = assert_matches_schema(result.stdout)
    assert doc["verdict"]["code"] == "unknown"
    assert doc["stream"] == "events"
    assert doc["invocations"] == []


def test_trace_on_the_embedded_broker_refuses_a_stream_the_file_does_not_hold(
    env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "broker.db"
    env = {**env, "RELAY_BROKER": "sqlite", "RELAY_BROKER_PATH": str(path)}
    assert run(env, "publish", "--event", '{"k": 1}').exit_code == 0
    for extra in ([], ["--json"]):
        result = run({**env, "REDIS_STREAM": "evnets"}, "trace", "1-0", *extra)
        assert result.exit_code == 1, result.output
        assert result.stdout == ""
        assert result.stderr == (
            f"relay: stream 'evnets' has no entries in the broker file {path} "
            "(REDIS_STREAM names it; the file holds: events)\n"
        )


def test_trace_document_covers_every_invocation_state_and_a_malformed_message() -> None:
    now = 1_780_282_900_000
    facts = MessageFacts(
        message_id="1780282800000-0",
        stream="events",
        group="relay",
        now_ms=now,
        ledger={
            "@class": "matched:a,b#t0",
            "a/run.handler": f"running:{now + 5000}#3#3f9c2a71deadbeef",
            "@at:a/run.handler": f"{now - 2000}#3f9c2a71deadbeef",
            "b/odd.handler": "garbage",
            "b/dead.handler": "exhausted:2",
            "@dlq": "1780282800001-0",
        },
        ledger_ttl_s=-1,
        body_bytes=12,
        pending={"consumer": "w1", "idle_ms": 2000, "deliveries": 3},
        dead_letters=[
            DeadLetterFact("1780282800001-0", {"reason": "malformed", "deliveries": "x"})
        ],
        dlq_scan_complete=False,
    )
    doc = assert_matches_schema(json.dumps({"schema": "relay.trace/1", **trace_document(facts)}))
    by_name = {i["name"]: i for i in doc["invocations"]}
    running = by_name["a/run.handler"]
    assert (running["state"], running["attempt"]) == ("running", 3)
    assert running["claimed_at"] == "2026-06-01T03:01:38Z"
    assert "3f9c2a71deadbeef" not in json.dumps(running)  # the text shows 8 characters
    assert by_name["b/odd.handler"]["state"] == "unreadable"
    assert by_name["b/dead.handler"]["dead_lettered"] is False
    assert doc["malformed_entry"] == "1780282800001-0"
    assert doc["verdict"]["code"] == "malformed"
    assert doc["ledger"] == {"exists": True, "expires_in_s": None}
    assert doc["dead_letters"][0]["deliveries"] is None
    assert doc["dead_letters_complete"] is False


def test_a_function_whose_first_build_failed_is_listed_as_failed(env: dict[str, str]) -> None:
    """The state view writes ``failed`` when nothing serves (no image yet)."""
    state = Path(env["RELAY_STATE_DIR"])
    failed = FunctionReconcileFailed(
        name="user-events-python",
        error="build failed: step 1/2 exited 1",
        at=time.time() - 60,
        runtime="python3.14",
        image=None,
        fingerprint=None,
        prepared_at=None,
        summary=None,
    )
    _row_from_view(state, failed)
    [fn] = assert_matches_schema(run(env, "function", "ls", "--json").stdout)["functions"]
    assert fn["status"] == "failed"
    shown = assert_matches_schema(run(env, "function", "inspect", fn["name"], "--json").stdout)
    assert (shown["status"], shown["image"]) == ("failed", None)
    assert shown["last_error"] == "build failed: step 1/2 exited 1"
