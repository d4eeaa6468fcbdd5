"""Which files of a function directory are source, and what that source hashes to.

The rules are git's: a ``.gitignore`` file applies to the directory that holds it
and everything below; its patterns are relative to that directory; a deeper file
overrides a shallower one, and inside one file the last matching pattern wins. An
ignored directory is never entered, so nothing under it can be re-included (git
behaves the same way). Decisions taken where git's behaviour does not transfer:

- ``.git/`` is never source.
- Every ``.gitignore`` file in a directory that is walked is source, even when a
  rule matches it: its rules decide what the function is, so an edit to them must
  change the fingerprint (the spec hashes "the applicable ``.gitignore`` files").
- Only ``.gitignore`` files inside the function directory count; the functions
  root, a surrounding repository and ``.git/info/exclude`` do not.

This module is pure: the filesystem walk that feeds it lives in
``relay.adapters.fs.source``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import msgspec
import pathspec

from relay.domain.names import DOCKER_NAME_COMPONENT

GITIGNORE = ".gitignore"
NEVER_SOURCE_DIRS = frozenset({".git"})
FINGERPRINT_HEX_LEN = 64
TAG_HEX_LEN = 16
_FINGERPRINT_DOMAIN = b"relay-source-fingerprint-v1\x00"


class SourceSelection(msgspec.Struct, frozen=True, kw_only=True):
    """The files that are a function's source: posix paths relative to its
    directory, sorted. Materialization, build context and fingerprint all use
    exactly this list."""

    files: tuple[str, ...]


_Spec = pathspec.PathSpec[pathspec.Pattern]


class IgnoreRules:
    """The ``.gitignore`` files met so far on one branch of a directory walk.

    Immutable: :meth:`descend` returns the rules for a subdirectory, adding that
    subdirectory's own ``.gitignore`` text if it has one.
    """

    __slots__ = ("_layers",)

    def __init__(self, layers: tuple[tuple[str, _Spec], ...] = ()) -> None:
        # Each layer: (directory prefix ending in "/" or "" for the root, its spec).
        self._layers = layers

    def descend(self, directory: str, gitignore_text: str | None) -> IgnoreRules:
        """Rules for ``directory`` (posix, relative; ``""`` is the root), given
        the text of the ``.gitignore`` inside it, if any."""
        if gitignore_text is None:
            return self
        prefix = f"{directory}/" if directory else ""
        # Plain last-match-wins per path (``PathSpec``), not ``GitIgnoreSpec``: the
        # latter ranks directory patterns above later negations (``*`` then
        # ``!sub/`` would keep ``sub/`` ignored, unlike git). Its reason to exist,
        # files below an ignored directory, is handled by never entering one.
        spec = pathspec.PathSpec.from_lines("gitignore", gitignore_text.splitlines())
        return IgnoreRules((*self._layers, (prefix, spec)))

    def ignored(self, path: str, *, is_dir: bool) -> bool:
        """Whether ``path`` (posix, relative to the function directory) is
        excluded. The deepest ``.gitignore`` with a matching pattern decides."""
        for prefix, spec in reversed(self._layers):
            if not path.startswith(prefix):
                continue  # pragma: no cover - layers always lie on the path's branch
            relative = path[len(prefix) :]
            result = spec.check_file(f"{relative}/" if is_dir else relative)
            if result.include is not None:
                return bool(result.include)
        return False


def is_source(path: str, rules: IgnoreRules, *, is_dir: bool) -> bool:
    """Whether a walked entry is source (a file) or is to be entered (a directory)."""
    name = path.rsplit("/", 1)[-1]
    if is_dir:
        return name not in NEVER_SOURCE_DIRS and not rules.ignored(path, is_dir=True)
    if name == GITIGNORE:
        return True
    return not rules.ignored(path, is_dir=False)


def fingerprint(entries: Iterable[tuple[str, bytes]]) -> str:
    """SHA-256 over every (path, bytes) pair, sorted by path, as 64 hex digits.

    Each path and each body is framed by its length, so no two different sets of
    files can produce the same byte stream (``a`` + ``bc`` never collides with
    ``ab`` + ``c``, and moving bytes between files changes the hash).
    """
    ordered = sorted(entries, key=lambda entry: entry[0])
    digest = hashlib.sha256(_FINGERPRINT_DOMAIN)
    digest.update(len(ordered).to_bytes(8, "big"))
    previous: str | None = None
    for path, data in ordered:
        if path == previous:
            raise ValueError(f"duplicate source path {path!r}")
        previous = path
        encoded = path.encode("utf-8")
        digest.update(len(encoded).to_bytes(8, "big"))
        digest.update(encoded)
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def image_tag(function: str, fp: str) -> str:
    """``relay-fn-<name>:<first 16 hex of the fingerprint>``.

    Raises ``ValueError`` for a name Docker cannot take as a repository: the
    function-name rule still admits a few (a trailing ``-`` or ``_``, ``._``,
    ``..``, ``___``) that Docker's reference grammar refuses.
    """
    if len(fp) != FINGERPRINT_HEX_LEN:
        raise ValueError(f"fingerprint must be {FINGERPRINT_HEX_LEN} hex digits")
    repository = f"relay-fn-{function}"
    if DOCKER_NAME_COMPONENT.fullmatch(repository) is None:
        raise ValueError(
            f"function name {function!r} cannot name a Docker image: separators ('.', '_',"
            " '-') must sit between letters or digits, '_' at most twice in a row"
        )
    return f"{repository}:{fp[:TAG_HEX_LEN]}"
