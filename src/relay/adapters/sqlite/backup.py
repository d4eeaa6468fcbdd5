"""A consistent copy of a live SQLite file (the state database, the broker file).

SQLite's online backup API copies the database as one snapshot: done in a single
step it holds a read transaction for the whole copy, which in WAL mode never blocks
the worker's writers, and it copies what was committed when the step began, the WAL
included. Copying the file with ``cp`` instead could catch a checkpoint half-way
and miss every commit still in the WAL.

A backup is never presented half-written: the copy goes to a temporary name in the
target directory, is checked (``PRAGMA integrity_check``), fsynced, renamed into
place and the directory fsynced; on any failure the temporary file is removed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from relay.adapters.fs.private import private_directory, private_file
from relay.domain.errors import RelayError

BUSY_TIMEOUT_S: Final = 30.0  # a worker's commit holds the write lock for milliseconds


class BackupError(RelayError):
    """One line saying which file could not be backed up and why."""


@dataclass(frozen=True)
class Copied:
    source: Path
    target: Path
    size: int


def back_up_all(sources: dict[str, Path], directory: Path, *, force: bool) -> list[Copied]:
    """Copy each live file of ``sources`` (backup name -> file) into ``directory``.

    Every source must exist before anything is written, so a mistyped path leaves no
    new directory behind."""
    for source in sources.values():
        if not source.is_file():
            raise BackupError(f"{source} does not exist (nothing to back up there)")
    prepare_directory(directory, list(sources), force=force)
    return [back_up(source, directory / name) for name, source in sources.items()]


def prepare_directory(directory: Path, names: list[str], *, force: bool) -> None:
    """Create ``directory`` (0700) if needed; refuse to overwrite a backup in it."""
    if directory.exists() and not directory.is_dir():
        raise BackupError(f"{directory} exists and is not a directory")
    existing = [name for name in names if (directory / name).exists()]
    if existing and not force:
        raise BackupError(
            f"{directory / existing[0]} already exists; pass --force to overwrite it"
            " or choose a new directory"
        )
    try:
        private_directory(directory)
    except OSError as exc:
        raise BackupError(f"cannot create {directory}: {exc.strerror or exc}") from exc


def back_up(source: Path, target: Path) -> Copied:
    """Copy the live database ``source`` to ``target`` (see the module docstring)."""
    if not source.is_file():
        raise BackupError(f"{source} does not exist (nothing to back up there)")
    temporary = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        _copy(source, temporary)
        _sync(temporary)
        os.replace(temporary, target)
        _sync_directory(target.parent)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot back up {source}: {exc}") from exc
    except OSError as exc:
        raise BackupError(f"cannot write {target}: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    return Copied(source, target, target.stat().st_size)


def _copy(source: Path, temporary: Path) -> None:
    # mode=rw: never create a missing source; the connection is only read from
    src = sqlite3.connect(f"file:{source}?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S)
    try:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()  # a leftover of a killed backup
        private_file(temporary)  # the copy holds events and errors: 0600 like its source
        dst = sqlite3.connect(temporary)
        try:
            src.backup(dst)  # pages=-1: one step, one snapshot
            dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal
            _integrity(dst, source)
        finally:
            dst.close()
    finally:
        src.close()


def _integrity(conn: sqlite3.Connection, source: Path) -> None:
    rows = conn.execute("PRAGMA integrity_check").fetchall()
    problems = [str(row[0]) for row in rows if row[0] != "ok"]
    if problems:
        raise BackupError(f"the copy of {source} fails its integrity check: {problems[0][:120]}")


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_directory(path: Path) -> None:
    """The rename is durable only once the directory entry is on disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
