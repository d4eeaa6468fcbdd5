"""Source selection (git's .gitignore semantics) and the source fingerprint."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from relay.adapters.fs.source import read_sources, select_sources
from relay.domain.errors import BuildError
from relay.domain.source import fingerprint, image_tag


def write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def selected(root: Path) -> list[str]:
    return list(select_sources(root).files)


def fp(root: Path) -> str:
    return fingerprint(read_sources(root, select_sources(root)))


# --- selection --------------------------------------------------------------------
def test_everything_is_source_without_gitignore(tmp_path: Path) -> None:
    files = {"template.yaml": "x", "handler.py": "", "pkg/mod.py": "", "pkg/deep/a.txt": ""}
    write(tmp_path, files)
    assert selected(tmp_path) == ["handler.py", "pkg/deep/a.txt", "pkg/mod.py", "template.yaml"]


def test_git_directory_is_never_source(tmp_path: Path) -> None:
    write(tmp_path, {"a.py": "", ".git/HEAD": "ref", ".git/objects/x": "", "sub/.git/y": ""})
    assert selected(tmp_path) == ["a.py"]


def test_root_rules_files_directories_and_negation(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            ".gitignore": "*.log\n!keep.log\nbuild/\n/only-root.txt\n# comment\n",
            "a.log": "",
            "keep.log": "",
            "sub/b.log": "",
            "sub/keep.log": "",
            "build/out.js": "",
            "sub/build/out.js": "",
            "only-root.txt": "",
            "sub/only-root.txt": "",
            "main.py": "",
        },
    )
    assert selected(tmp_path) == [
        ".gitignore",
        "keep.log",
        "main.py",
        "sub/keep.log",
        "sub/only-root.txt",
    ]


def test_directory_only_pattern_does_not_match_a_file(tmp_path: Path) -> None:
    write(tmp_path, {".gitignore": "cache/\n", "cache": "a file named cache", "x/cache/y": ""})
    assert selected(tmp_path) == [".gitignore", "cache"]


def test_nothing_under_an_ignored_directory_can_be_reincluded(tmp_path: Path) -> None:
    write(tmp_path, {".gitignore": "dist/\n!dist/keep.js\n", "dist/keep.js": "", "dist/x.js": ""})
    assert selected(tmp_path) == [".gitignore"]


def test_contents_pattern_allows_reinclusion(tmp_path: Path) -> None:
    write(tmp_path, {".gitignore": "dist/*\n!dist/keep.js\n", "dist/keep.js": "", "dist/x.js": ""})
    assert selected(tmp_path) == [".gitignore", "dist/keep.js"]


def test_nested_gitignore_applies_to_its_subtree_relative_to_itself(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pkg/.gitignore": "/gen.py\n*.tmp\n",
            "pkg/gen.py": "",
            "pkg/inner/gen.py": "",
            "pkg/x.tmp": "",
            "pkg/inner/y.tmp": "",
            "gen.py": "",
            "z.tmp": "",
        },
    )
    assert selected(tmp_path) == ["gen.py", "pkg/.gitignore", "pkg/inner/gen.py", "z.tmp"]


def test_deeper_gitignore_overrides_shallower(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            ".gitignore": "*.dat\n",
            "a.dat": "",
            "keep/.gitignore": "!*.dat\n",
            "keep/b.dat": "",
            "other/c.dat": "",
        },
    )
    assert selected(tmp_path) == [".gitignore", "keep/.gitignore", "keep/b.dat"]


def test_shallower_rule_still_applies_when_deeper_file_does_not_match(tmp_path: Path) -> None:
    write(tmp_path, {".gitignore": "*.dat\n", "sub/.gitignore": "*.tmp\n", "sub/a.dat": ""})
    assert selected(tmp_path) == [".gitignore", "sub/.gitignore"]


def test_gitignore_files_are_source_even_when_matched(tmp_path: Path) -> None:
    write(tmp_path, {".gitignore": ".gitignore\n*\n!*/\n", "sub/.gitignore": "", "a.py": ""})
    assert selected(tmp_path) == [".gitignore", "sub/.gitignore"]


def test_gitignore_inside_an_ignored_directory_is_not_source(tmp_path: Path) -> None:
    write(tmp_path, {".gitignore": "vendor/\n", "vendor/.gitignore": "", "vendor/x.py": ""})
    assert selected(tmp_path) == [".gitignore"]


# --- symlinks ---------------------------------------------------------------------
def test_symlink_outside_is_skipped_with_a_warning(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("host secret")
    fn = tmp_path / "fn"
    write(fn, {"a.py": ""})
    (fn / "leak.txt").symlink_to(outside)
    (fn / "up").symlink_to(tmp_path, target_is_directory=True)
    (fn / "abs").symlink_to("/etc/passwd")
    with capture_logs() as logs:
        assert selected(fn) == ["a.py"]
    skipped = sorted(e["path"] for e in logs if e["event"] == "source_symlink_outside_skipped")
    assert skipped == ["abs", "leak.txt", "up"]
    assert all(e["log_level"] == "warning" for e in logs)


def test_symlink_to_a_file_inside_is_source_with_the_target_bytes(tmp_path: Path) -> None:
    write(tmp_path, {"real/data.json": "{}"})
    (tmp_path / "alias.json").symlink_to("real/data.json")
    selection = select_sources(tmp_path)
    assert selection.files == ("alias.json", "real/data.json")
    assert dict(read_sources(tmp_path, selection))["alias.json"] == b"{}"


def test_symlinked_directory_and_broken_link_are_skipped(tmp_path: Path) -> None:
    write(tmp_path, {"real/x.py": ""})
    (tmp_path / "loop").symlink_to(".", target_is_directory=True)
    (tmp_path / "dangling").symlink_to("missing.txt")
    with capture_logs() as logs:
        assert selected(tmp_path) == ["real/x.py"]
    events = sorted(e["event"] for e in logs)
    assert events == ["source_symlink_broken_skipped", "source_symlink_directory_skipped"]


def test_read_refuses_a_link_retargeted_outside_after_selection(tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("x")
    fn = tmp_path / "fn"
    write(fn, {"inner.txt": "y"})
    (fn / "link.txt").symlink_to("inner.txt")
    selection = select_sources(fn)
    (fn / "link.txt").unlink()
    (fn / "link.txt").symlink_to(tmp_path / "outside.txt")
    with pytest.raises(BuildError, match="outside"):
        read_sources(fn, selection)


# --- fingerprint ------------------------------------------------------------------
def test_fingerprint_is_64_hex_and_order_independent() -> None:
    a = fingerprint([("a", b"1"), ("b", b"2")])
    assert a == fingerprint([("b", b"2"), ("a", b"1")])
    assert len(a) == 64
    int(a, 16)


def test_fingerprint_framing_is_unambiguous() -> None:
    assert fingerprint([("a", b"bc")]) != fingerprint([("ab", b"c")])
    assert fingerprint([("a", b"x"), ("b", b"")]) != fingerprint([("a", b""), ("b", b"x")])
    assert fingerprint([("a", b"")]) != fingerprint([])
    assert fingerprint([("a", b"1")]) != fingerprint([("b", b"1")])


def test_fingerprint_rejects_duplicate_paths() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        fingerprint([("a", b""), ("a", b"")])


def test_image_tag() -> None:
    full = "0123456789abcdef" * 4
    assert image_tag("user-events", full) == "relay-fn-user-events:0123456789abcdef"
    with pytest.raises(ValueError, match="64"):
        image_tag("x", "abc")


@pytest.mark.parametrize("name", ["jobs.v2", "a__b", "a--b", "welcome_email", "0x"])
def test_image_tag_accepts_docker_safe_names(name: str) -> None:
    assert image_tag(name, "f" * 64) == f"relay-fn-{name}:{'f' * 16}"


@pytest.mark.parametrize("name", ["abc-", "abc_", "a___b", "a._b", "a..b", "a-.b"])
def test_image_tag_refuses_names_docker_cannot_take(name: str) -> None:
    with pytest.raises(ValueError, match="cannot name a Docker image"):
        image_tag(name, "f" * 64)


def test_fingerprint_changes_with_source_template_and_rules(tmp_path: Path) -> None:
    write(
        tmp_path,
        {"template.yaml": "runtime: python3.14\n", "h.py": "print(1)\n", ".gitignore": "*.log\n"},
    )
    base = fp(tmp_path)
    assert fp(tmp_path) == base  # stable

    (tmp_path / "debug.log").write_text("noise")
    assert fp(tmp_path) == base  # ignored file: unchanged

    (tmp_path / "h.py").write_text("print(2)\n")
    edited = fp(tmp_path)
    assert edited != base

    (tmp_path / "template.yaml").write_text("runtime: python3.14\nconcurrency: 3\n")
    templated = fp(tmp_path)
    assert templated != edited

    (tmp_path / ".gitignore").write_text("*.log\n# a comment only\n")
    assert fp(tmp_path) != templated  # a rule file edit gates a rebuild


def test_fingerprint_changes_when_an_ignored_file_becomes_source(tmp_path: Path) -> None:
    write(tmp_path, {".gitignore": "*.log\n", "a.log": "x"})
    before = fp(tmp_path)
    (tmp_path / ".gitignore").write_text("")
    after = fp(tmp_path)
    assert before != after
    assert "a.log" in selected(tmp_path)


def test_fingerprint_ignores_file_metadata(tmp_path: Path) -> None:
    write(tmp_path, {"h.py": "x"})
    before = fp(tmp_path)
    os.utime(tmp_path / "h.py", (1, 1))
    (tmp_path / "h.py").chmod(0o600)
    assert fp(tmp_path) == before


def test_renaming_a_file_changes_the_fingerprint(tmp_path: Path) -> None:
    write(tmp_path, {"a.py": "x"})
    before = fp(tmp_path)
    (tmp_path / "a.py").rename(tmp_path / "b.py")
    assert fp(tmp_path) != before


# --- agreement with git itself ------------------------------------------------------
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_selection_agrees_with_git(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            ".gitignore": "*.pyc\n__pycache__/\n/dist\nlogs/*\n!logs/keep.txt\n"
            "*.tmp\n!important.tmp\n",
            "app.py": "",
            "app.pyc": "",
            "__pycache__/app.cpython.pyc": "",
            "dist/bundle.js": "",
            "src/dist/ok.js": "",
            "logs/a.txt": "",
            "logs/keep.txt": "",
            "x.tmp": "",
            "important.tmp": "",
            "pkg/.gitignore": "*.json\n!config.json\nsecret/\n/local.txt\n",
            "pkg/data.json": "",
            "pkg/config.json": "",
            "pkg/secret/key": "",
            "pkg/local.txt": "",
            "pkg/sub/local.txt": "",
            "pkg/sub/.gitignore": "!data.json\n*.md\n",
            "pkg/sub/data.json": "",
            "pkg/sub/README.md": "",
            "deep/a/b/c.txt": "",
            "deep/a/b/.gitignore": "c.txt\n",
        },
    )
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    listed = subprocess.run(
        ["git", "-C", str(tmp_path), "ls-files", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert selected(tmp_path) == sorted(listed)


def test_a_name_that_is_not_utf8_is_skipped(tmp_path: Path) -> None:
    write(tmp_path, {"ok.py": ""})
    with open(os.path.join(os.fsencode(tmp_path), b"bad-\xff.txt"), "wb") as handle:
        handle.write(b"x")
    with capture_logs() as logs:
        assert selected(tmp_path) == ["ok.py"]
    assert [e["event"] for e in logs] == ["source_name_not_utf8_skipped"]
