"""Directories and files only Relay's user may read: its state (env values, errors,
secrets), its lock and its control socket.

``os.mkdir`` and ``open`` apply the process umask to the mode they are given, and
``Path.mkdir(parents=True)`` creates the parents with the default mode, so a
permissive umask (``0``, ``002``) would leave them readable, even writable, by
others. Everything here sets the mode explicitly, whatever the umask.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_directory(path: Path) -> None:
    """Create ``path`` and every missing parent with mode 0700.

    A directory that already exists keeps its mode: it is the operator's (a mounted
    volume, a shared parent), and what Relay puts inside it is private on its own.
    """
    missing: list[Path] = []
    current = Path(path)
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            os.mkdir(directory, DIR_MODE)
            os.chmod(directory, DIR_MODE)  # a umask such as 0277 removes bits too


def private_file(path: Path) -> None:
    """Create ``path`` (empty) with mode 0600 if it is missing; tighten it to 0600 if
    it exists with more. Never follows a symlink."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, FILE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o777 != FILE_MODE:
            with contextlib.suppress(PermissionError):  # not ours: leave it as it is
                os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def tighten_if_present(path: Path) -> None:
    """Mode 0600 for ``path`` when it exists (a file SQLite made beside the database
    before Relay made its files private); nothing when it does not."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        if os.lstat(path).st_mode & 0o777 != FILE_MODE:
            os.chmod(path, FILE_MODE, follow_symlinks=False)
