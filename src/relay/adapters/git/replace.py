"""The deterministic replace: the functions directory becomes exactly the source.

Every direct, non-hidden subdirectory of the source root holding a regular
``template.yaml`` is one function. A sync runs in two phases:

1. **stage**: each function that differs from what is served is copied to a
   hidden temporary directory inside the functions directory (hidden names are
   never candidates for discovery or the watcher). If any copy fails, every
   staged copy is deleted and nothing served has changed.
2. **swap**: each staged copy replaces its function in one step (Linux
   ``renameat2(RENAME_EXCHANGE)``; where that is missing, two renames), and each
   function directory absent from the source is renamed away, then deleted.

So the reconciler sees every function either as it was or as it is now, never
half written. Hidden entries and plain files at the top level are left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import filecmp
import functools
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relay.domain.git import GitError

TEMPLATE_FILE = "template.yaml"
STAGING_PREFIX = ".relay-sync-"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100

Copier = Callable[[Path, Path], object]


@dataclass(frozen=True, slots=True)
class ReplaceResult:
    functions: list[str]  # every function the source holds, sorted
    updated: list[str]  # added or changed
    removed: list[str]


def source_functions(root: Path) -> list[str]:
    """The function directories of a checkout (or of its ``--path``). A name that
    is not UTF-8 (a commit can hold any bytes) is refused before anything is
    staged: it could be neither recorded in ``state.json`` nor named in a log."""
    found = []
    with os.scandir(root) as entries:
        candidates = [e for e in entries
                      if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)]
    for entry in candidates:
        if not _is_utf8(entry.name):
            raise GitError(
                f"directory {ascii(os.fsencode(entry.name))[1:]} is not a UTF-8 name; "
                "rename it in the repository (the functions were left as they were)"
            )
        template = Path(entry.path) / TEMPLATE_FILE
        if template.is_file() and not template.is_symlink():
            found.append(entry.name)
    return sorted(found)


def _is_utf8(name: str) -> bool:
    try:
        name.encode()  # bytes that were not UTF-8 arrive as lone surrogates
    except UnicodeEncodeError:
        return False
    return True


def replace_functions(
    root: Path, functions_dir: Path, *, copy: Copier | None = None
) -> ReplaceResult:
    """Make ``functions_dir`` hold exactly the functions of ``root``."""
    copier = copy or _copy_tree
    functions_dir.mkdir(parents=True, exist_ok=True)
    remove_leftovers(functions_dir)
    wanted = source_functions(root)
    token = secrets.token_hex(4)
    staged: dict[str, Path] = {}
    try:
        for name in wanted:
            if _same_tree(root / name, functions_dir / name):
                continue
            staging = functions_dir / f"{STAGING_PREFIX}{token}-{name}"
            staged[name] = staging
            copier(root / name, staging)
    except BaseException:
        for staging in staged.values():
            _rmtree(staging)
        raise
    for name, staging in staged.items():
        _swap_in(staging, functions_dir / name, functions_dir / f"{STAGING_PREFIX}{token}-old")
    removed = []
    for entry in sorted(os.scandir(functions_dir), key=lambda e: e.name):
        if entry.name.startswith(".") or entry.name in wanted:
            continue
        if entry.is_dir():  # a symlinked function directory too
            trash = functions_dir / f"{STAGING_PREFIX}{token}-gone-{entry.name}"
            os.rename(entry.path, trash)
            _rmtree(trash)
            removed.append(entry.name)
    return ReplaceResult(functions=wanted, updated=sorted(staged), removed=removed)


def remove_leftovers(functions_dir: Path) -> None:
    """Delete staging directories a killed sync left behind."""
    for entry in os.scandir(functions_dir):
        if entry.name.startswith(STAGING_PREFIX):
            _rmtree(Path(entry.path))


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True)


def _swap_in(staging: Path, target: Path, old: Path) -> None:
    if not os.path.lexists(target):
        os.rename(staging, target)
        return
    if _exchange(staging, target):
        _rmtree(staging)  # now holds the previous version
        return
    os.rename(target, old)
    os.rename(staging, target)
    _rmtree(old)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths; False where the kernel or libc cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@functools.cache
def _renameat2() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name, use_errno=True), "renameat2")  # noqa: B009 - may be absent
    except AttributeError:
        return None


def _same_tree(a: Path, b: Path) -> bool:
    """Same entries, file types, executable bits and contents (symlinks by target)."""
    if not b.is_dir() or b.is_symlink():
        return False
    return _listing(a) == _listing(b) and all(
        filecmp.cmp(a / rel, b / rel, shallow=False)
        for rel, kind in _listing(a).items() if kind[0] == "f"
    )


def _listing(root: Path) -> dict[str, tuple[str, ...]]:
    found: dict[str, tuple[str, ...]] = {}
    for directory, dirs, files in os.walk(root):
        base = Path(directory)
        for name in [*dirs, *files]:
            path = base / name
            rel = str(path.relative_to(root))
            info = path.lstat()
            if path.is_symlink():
                found[rel] = ("l", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("d",)
            else:
                found[rel] = ("f", str(info.st_size), str(info.st_mode & 0o111))
    return found


def _rmtree(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path)
