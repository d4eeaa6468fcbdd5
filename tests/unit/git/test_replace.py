"""The deterministic replace on a real temporary filesystem (no git, no Docker)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from relay.adapters.git.replace import STAGING_PREFIX, replace_functions, source_functions


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def tree(root: Path) -> dict[str, str]:
    found = {}
    for directory, _dirs, files in os.walk(root):
        for name in files:
            path = Path(directory) / name
            found[str(path.relative_to(root))] = path.read_text()
    return found


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    write(root, {
        "a/template.yaml": "runtime: python3.14\n",
        "a/h.py": "A1",
        "b/template.yaml": "runtime: node24\n",
        "b/lib/x.js": "B1",
        "docs/README.md": "not a function: no template",
        ".github/template.yaml": "hidden: never a function",
        "README.md": "top-level file",
    })
    return root


def test_each_subdirectory_with_a_template_becomes_exactly_one_function(
    checkout: Path, tmp_path: Path
) -> None:
    functions = tmp_path / "functions"
    write(functions, {"old/template.yaml": "x", "a/stale.py": "gone", "notes.txt": "kept"})
    (functions / ".cache").mkdir()
    result = replace_functions(checkout, functions)
    assert result.functions == ["a", "b"]
    assert result.updated == ["a", "b"]
    assert result.removed == ["old"]
    assert tree(functions) == {
        "a/template.yaml": "runtime: python3.14\n",
        "a/h.py": "A1",
        "b/template.yaml": "runtime: node24\n",
        "b/lib/x.js": "B1",
        "notes.txt": "kept",  # plain files at the top level are not functions
    }
    assert (functions / ".cache").is_dir()  # hidden entries are never touched


def test_an_unchanged_function_is_not_rewritten(checkout: Path, tmp_path: Path) -> None:
    functions = tmp_path / "functions"
    replace_functions(checkout, functions)
    inode = (functions / "a" / "h.py").stat().st_ino
    (checkout / "b" / "lib" / "x.js").write_text("B2")
    result = replace_functions(checkout, functions)
    assert result.updated == ["b"]
    assert (functions / "a" / "h.py").stat().st_ino == inode
    assert (functions / "b" / "lib" / "x.js").read_text() == "B2"


def test_an_executable_bit_change_is_a_change(checkout: Path, tmp_path: Path) -> None:
    functions = tmp_path / "functions"
    replace_functions(checkout, functions)
    (checkout / "a" / "h.py").chmod(0o755)
    assert replace_functions(checkout, functions).updated == ["a"]
    assert (functions / "a" / "h.py").stat().st_mode & 0o111


def test_a_source_with_zero_functions_empties_the_directory(
    checkout: Path, tmp_path: Path
) -> None:
    functions = tmp_path / "functions"
    replace_functions(checkout, functions)
    empty = tmp_path / "empty"
    empty.mkdir()
    result = replace_functions(empty, functions)
    assert result.removed == ["a", "b"]
    assert list(functions.iterdir()) == []


def test_a_copy_failing_halfway_leaves_the_last_good_state(
    checkout: Path, tmp_path: Path
) -> None:
    functions = tmp_path / "functions"
    replace_functions(checkout, functions)
    before = tree(functions)
    (checkout / "a" / "h.py").write_text("A2")
    (checkout / "b" / "lib" / "x.js").write_text("B2")
    write(checkout, {"c/template.yaml": "new"})
    copies: list[str] = []

    def failing_copy(source: Path, target: Path) -> None:
        copies.append(source.name)
        shutil.copytree(source, target, symlinks=True)
        if len(copies) == 2:
            raise OSError(28, "No space left on device", str(target))

    with pytest.raises(OSError, match="No space left"):
        replace_functions(checkout, functions, copy=failing_copy)
    assert copies == ["a", "b"]  # the failure came after one function was fully staged
    assert tree(functions) == before
    assert [p.name for p in functions.iterdir() if p.name.startswith(STAGING_PREFIX)] == []


def test_staging_left_by_a_killed_sync_is_cleaned_and_never_served(
    checkout: Path, tmp_path: Path
) -> None:
    functions = tmp_path / "functions"
    write(functions, {f"{STAGING_PREFIX}dead-a/template.yaml": "half"})
    replace_functions(checkout, functions)
    assert sorted(p.name for p in functions.iterdir()) == ["a", "b"]


def test_symlinked_directories_and_templates_in_the_source_are_not_functions(
    checkout: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    write(outside, {"template.yaml": "x", "secret.txt": "s"})
    (checkout / "linked").symlink_to(outside)
    (checkout / "lt").mkdir()
    (checkout / "lt" / "template.yaml").symlink_to(outside / "template.yaml")
    assert source_functions(checkout) == ["a", "b"]


def test_a_function_directory_that_was_a_symlink_is_replaced_by_a_copy(
    checkout: Path, tmp_path: Path
) -> None:
    functions = tmp_path / "functions"
    functions.mkdir()
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere, {"template.yaml": "operator's own"})
    (functions / "a").symlink_to(elsewhere)
    replace_functions(checkout, functions)
    assert not (functions / "a").is_symlink()
    assert (functions / "a" / "h.py").read_text() == "A1"
    assert (elsewhere / "template.yaml").read_text() == "operator's own"


def test_a_reader_scanning_during_replaces_never_sees_a_half_written_function(
    tmp_path: Path,
) -> None:
    """A scanner (what discovery and the reconciler do) runs flat out in a thread
    while the source flips between two versions: every function it sees is
    complete, one version or the other, and never missing."""
    versions = []
    for tag in ("one", "two"):
        root = tmp_path / f"source-{tag}"
        write(root, {f"fn/file{i:03}.txt": f"{tag}-{i}" for i in range(100)})
        write(root, {"fn/template.yaml": tag})
        versions.append(root)
    functions = tmp_path / "functions"
    replace_functions(versions[0], functions)
    complete = [tree(v) for v in versions]
    problems: list[str] = []
    scans = 0
    stop = threading.Event()

    def still_served(directory_fd: int) -> bool:
        try:
            return os.stat(functions / "fn").st_ino == os.fstat(directory_fd).st_ino
        except FileNotFoundError:
            return False

    def read(directory_fd: int) -> dict[str, str]:
        found = {}
        for name in os.listdir(directory_fd):
            fd = os.open(name, os.O_RDONLY, dir_fd=directory_fd)
            with os.fdopen(fd) as handle:
                found[f"fn/{name}"] = handle.read()
        return found

    def scan() -> None:
        nonlocal scans
        while not stop.is_set():
            scans += 1
            try:
                # one directory, read through its descriptor: what a reader that
                # opened the function sees, whatever is renamed meanwhile
                directory_fd = os.open(functions / "fn", os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                problems.append("fn missing")
                continue
            try:
                seen = read(directory_fd)
            except FileNotFoundError:
                # allowed only for a version already swapped out (being deleted):
                # a directory that is still served never loses a file
                if still_served(directory_fd):
                    problems.append("a file vanished from the served function")
                continue
            else:
                # a version swapped out may be listed part-deleted (or empty) by
                # now; one still served is always complete
                if seen not in complete and still_served(directory_fd):
                    problems.append(f"partial: {len(seen)} files")
            finally:
                os.close(directory_fd)

    reader = threading.Thread(target=scan)
    reader.start()
    flips = 0
    try:
        # At least 20 flips, and on until the reader really ran alongside them
        # (a loaded machine may schedule it late): a condition, not a count of tries.
        deadline = time.monotonic() + 60
        while flips < 20 or scans < 5:
            assert time.monotonic() < deadline, f"the reader scanned {scans} times"
            flips += 1
            replace_functions(versions[flips % 2], functions)
    finally:
        stop.set()
        reader.join(timeout=30)
    assert problems == []
