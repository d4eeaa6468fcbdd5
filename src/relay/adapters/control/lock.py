"""The process lock: one ``relay start`` per run directory.

``relay start`` creates the run directory (0700) and takes a non-blocking
``flock`` on ``relay.lock`` before it binds the control socket, so a second
worker fails here, before it could touch the live worker's socket. The kernel
drops the lock when the process exits, so a leftover lock file is inert.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Final

from relay.adapters.fs.private import private_directory
from relay.domain.errors import RelayError

DEFAULT_RUN_DIR: Final = Path("/run/relay")
LOCK_NAME: Final = "relay.lock"
SOCKET_NAME: Final = "relay.sock"


class LockHeld(RelayError):
    """Another relay worker already holds the process lock."""


def socket_path(run_dir: Path) -> Path:
    """Where the worker's control socket lives inside ``run_dir``."""
    return run_dir / SOCKET_NAME


class ProcessLock:
    """An exclusive, non-blocking ``flock`` on ``<run_dir>/relay.lock``.

    Taken in the constructor; released by :meth:`close` (or the context manager).
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK_NAME
        try:
            private_directory(run_dir.parent)
            run_dir.mkdir(mode=0o700, exist_ok=True)
            os.chmod(run_dir, 0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise RelayError(f"cannot create {self.path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise LockHeld(f"another relay worker holds {self.path}") from exc
        except OSError as exc:
            os.close(fd)
            raise RelayError(f"cannot lock {self.path}: {exc.strerror}") from exc
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    @property
    def socket_path(self) -> Path:
        return socket_path(self.run_dir)

    def close(self) -> None:
        """Release the lock (idempotent). The lock file stays; it is inert."""
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> ProcessLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
