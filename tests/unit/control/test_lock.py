from __future__ import annotations

import stat
from pathlib import Path

import pytest

from relay.adapters.control.lock import LockHeld, ProcessLock


def test_second_lock_fails_with_one_clear_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with ProcessLock(run_dir):
        with pytest.raises(LockHeld) as info:
            ProcessLock(run_dir)
        assert str(info.value) == f"another relay worker holds {run_dir / 'relay.lock'}"


def test_lock_is_released_on_close_and_dir_is_private(tmp_path: Path) -> None:
    run_dir = tmp_path / "nested" / "run"
    lock = ProcessLock(run_dir)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    lock.close()
    lock.close()  # idempotent
    assert not lock.held
    with ProcessLock(run_dir) as again:
        assert again.held
