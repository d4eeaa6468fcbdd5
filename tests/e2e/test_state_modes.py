"""``relay start`` and ``relay secret set`` under a permissive umask: what they
create under the state and run directories is private to Relay's user."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.e2e.conftest import WorkerFactory
from tests.e2e.harness import run_relay

pytestmark = pytest.mark.e2e


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_worker_started_under_umask_0_keeps_its_state_private(
    relay_worker: WorkerFactory, tmp_path: Path
) -> None:
    old = os.umask(0)  # inherited by the processes started below
    try:
        worker = relay_worker()
        assert run_relay(["secret", "set", "api-key"], worker.admin_env, stdin="v").returncode == 0
        state, run = worker.state_dir, worker.run_dir
        expected = {
            state: 0o700,
            state / "db.sqlite3": 0o600,
            state / "secrets": 0o700,
            state / "secrets" / "api-key": 0o600,
            run: 0o700,
            run / "relay.lock": 0o600,
            run / "relay.sock": 0o600,
        }
        expected.update({p: 0o600 for p in state.glob("db.sqlite3-*")})
        seen = {path: mode(path) for path in expected}
        assert worker.stop() == 0
    finally:
        os.umask(old)
    assert seen == expected
