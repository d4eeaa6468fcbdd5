"""The env-hash key: created once with mode 0600, then read back unchanged."""

from __future__ import annotations

from pathlib import Path

from relay.adapters.fs.env_key import load_env_key


def test_the_key_is_created_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "state" / "service-env.key"
    first = load_env_key(path)
    assert len(first) == 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_env_key(path) == first


def test_a_truncated_key_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "service-env.key"
    path.write_bytes(b"short")
    assert len(load_env_key(path)) == 32
