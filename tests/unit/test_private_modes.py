"""The state and run directories and what Relay writes in them are private to its
user whatever the umask: directories 0700, files 0600 (they hold env values,
errors and secrets)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.adapters.control.lock import ProcessLock
from relay.adapters.fs.secrets import FileSecretStore
from relay.adapters.sqlite.db import open_db


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture(params=[0o000, 0o002, 0o277])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """Permissive (0, 002) and one that removes owner bits too (0277)."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_the_state_database_and_the_directories_made_for_it_are_private(
    tmp_path: Path, umask: int
) -> None:
    state = tmp_path / "var" / "lib" / "relay"
    db = open_db(state / "db.sqlite3")
    try:
        db.upsert("functions", "fn", {"env": {"A": "x"}}, "2026-01-01T00:00:00Z")
    finally:
        db.close()
    for directory in (tmp_path / "var", tmp_path / "var" / "lib", state):
        assert mode(directory) == 0o700, directory
    files = [p for p in state.iterdir() if p.name.startswith("db.sqlite3")]
    assert state / "db.sqlite3" in files
    for path in files:  # the database and whatever -wal/-shm SQLite left beside it
        assert mode(path) == 0o600, path


def test_the_wal_and_shm_files_sqlite_makes_while_open_are_private(
    tmp_path: Path, umask: int
) -> None:
    db = open_db(tmp_path / "state" / "db.sqlite3")
    try:
        db.upsert("functions", "fn", {"env": {"A": "x"}}, "2026-01-01T00:00:00Z")
        beside = sorted(p.name for p in (tmp_path / "state").iterdir())
        assert beside == ["db.sqlite3", "db.sqlite3-shm", "db.sqlite3-wal"]
        for name in beside:
            assert mode(tmp_path / "state" / name) == 0o600, name
    finally:
        db.close()


def test_a_database_left_readable_by_an_older_run_is_tightened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    open_db(state / "db.sqlite3").close()
    for name in ("db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm"):
        path = state / name
        path.touch()
        path.chmod(0o644)
    open_db(state / "db.sqlite3").close()
    for name in ("db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm"):
        if (state / name).exists():
            assert mode(state / name) == 0o600, name


def test_an_existing_state_directory_keeps_its_mode(tmp_path: Path) -> None:
    state = tmp_path / "volume"
    state.mkdir(mode=0o755)
    state.chmod(0o755)  # a mounted volume: the operator's
    open_db(state / "db.sqlite3").close()
    assert mode(state) == 0o755
    assert mode(state / "db.sqlite3") == 0o600


def test_the_secret_store_makes_the_state_directory_private(tmp_path: Path, umask: int) -> None:
    store = FileSecretStore(tmp_path / "new" / "state" / "secrets")
    store.set("api-key", "v")
    for directory in (tmp_path / "new", tmp_path / "new" / "state", store.directory):
        assert mode(directory) == 0o700, directory
    assert mode(store.directory / "api-key") == 0o600


def test_the_run_directory_and_its_lock_are_private(tmp_path: Path, umask: int) -> None:
    run = tmp_path / "run" / "relay"
    with ProcessLock(run):
        assert mode(tmp_path / "run") == 0o700
        assert mode(run) == 0o700
        assert mode(run / "relay.lock") & 0o077 == 0  # nobody else may open it
