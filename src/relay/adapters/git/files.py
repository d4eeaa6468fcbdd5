"""Where git sync keeps its files, and the one way it writes them.

Every path lives under the state directory (``/var/lib/relay``): the deploy key
and Relay's own ``known_hosts`` in ``ssh/`` (0700), ``source.json``, the sync
state, the lock and the checkout in ``git/`` (0700). Files are written to a
temporary name in the same directory, fsynced and renamed into place, so a
reader sees the old content or the new one, never a torn file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class GitPaths:
    """The git sync layout under one state directory."""

    state_dir: Path

    @property
    def ssh_dir(self) -> Path:
        return self.state_dir / "ssh"

    @property
    def private_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def public_key(self) -> Path:
        return self.ssh_dir / "id_ed25519.pub"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def git_dir(self) -> Path:
        return self.state_dir / "git"

    @property
    def source(self) -> Path:
        return self.git_dir / "source.json"

    @property
    def state(self) -> Path:
        return self.git_dir / "state.json"

    @property
    def lock(self) -> Path:
        return self.git_dir / "sync.lock"

    @property
    def checkout(self) -> Path:
        return self.git_dir / "checkout"


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if needed and make it mode 0700."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if (path.stat().st_mode & 0o777) != 0o700:
        os.chmod(path, 0o700)
    return path


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` with ``mode``: temp file, fsync, rename, fsync dir."""
    tmp = path.with_name(f".tmp-{secrets.token_hex(6)}-{path.name}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)  # the umask may have narrowed it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
