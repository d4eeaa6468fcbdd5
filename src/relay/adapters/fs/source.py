"""Walk a function directory and read its selected source.

The ignore rules come from ``relay.domain.source``; this module only does the
I/O. Symlinks: a symlink to a regular file inside the function directory is
source, and its target's bytes are read under the link's path (the image gets a
regular file). A symlink that points outside the directory, a broken symlink and
a symlink to a directory are skipped with a warning, so a build context can
never pull in a file from elsewhere on the host and a link loop can never hang
the walk. Sockets, FIFOs and devices are skipped silently; a name that is not
UTF-8 is skipped with a warning (an image path and the fingerprint need text).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import structlog

from relay.domain.errors import BuildError
from relay.domain.source import GITIGNORE, IgnoreRules, SourceSelection, is_source

log = structlog.get_logger(__name__)


def select_sources(function_dir: Path) -> SourceSelection:
    """The files of ``function_dir`` that are source, by its ``.gitignore`` rules."""
    root = Path(os.path.realpath(function_dir))
    files: list[str] = []
    _walk(root, "", IgnoreRules(), files)
    return SourceSelection(files=tuple(sorted(files)))


def read_sources(function_dir: Path, selection: SourceSelection) -> list[tuple[str, bytes]]:
    """The bytes of every selected file, as ``(path, bytes)`` in selection order.

    Containment is checked again at read time: a symlink retargeted outside the
    directory since the walk is refused rather than followed.
    """
    root = Path(os.path.realpath(function_dir))
    entries: list[tuple[str, bytes]] = []
    for relative in selection.files:
        target = Path(os.path.realpath(root / relative))
        if not _inside(root, target):
            raise BuildError(f"source file {relative} now points outside the function directory")
        try:
            entries.append((relative, target.read_bytes()))
        except OSError as exc:
            raise BuildError(f"cannot read source file {relative}: {exc.strerror}") from exc
    return entries


def _walk(root: Path, directory: str, rules: IgnoreRules, out: list[str]) -> None:
    here = root / directory if directory else root
    rules = rules.descend(directory, _read_gitignore(root, here / GITIGNORE))
    try:
        entries = sorted(os.scandir(here), key=lambda entry: entry.name)
    except OSError as exc:
        log.warning("source_directory_unreadable", path=directory or ".", error=exc.strerror)
        return
    for entry in entries:
        path = f"{directory}/{entry.name}" if directory else entry.name
        if not _utf8(entry.name):
            log.warning("source_name_not_utf8_skipped", path=path.encode(errors="replace"))
            continue
        kind = _kind(root, entry, path)
        if kind == "dir":
            if is_source(path, rules, is_dir=True):
                _walk(root, path, rules, out)
        elif kind == "file" and is_source(path, rules, is_dir=False):
            out.append(path)


def _kind(root: Path, entry: os.DirEntry[str], path: str) -> str | None:
    """``"dir"``, ``"file"`` or None (skip) for one directory entry."""
    if not entry.is_symlink():
        if entry.is_dir(follow_symlinks=False):
            return "dir"
        return "file" if entry.is_file(follow_symlinks=False) else None
    target = Path(os.path.realpath(entry.path))
    if not _inside(root, target):
        log.warning("source_symlink_outside_skipped", path=path)
        return None
    try:
        mode = target.stat().st_mode
    except OSError:
        log.warning("source_symlink_broken_skipped", path=path)
        return None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        log.warning("source_symlink_directory_skipped", path=path)
    return None


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes arrive as surrogates
        return False
    return True


def _inside(root: Path, target: Path) -> bool:
    return target == root or target.is_relative_to(root)


def _read_gitignore(root: Path, path: Path) -> str | None:
    try:
        if path.is_symlink() and not _inside(root, Path(os.path.realpath(path))):
            return None
        return path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("source_gitignore_unreadable", path=str(path), error=exc.strerror)
        return None
