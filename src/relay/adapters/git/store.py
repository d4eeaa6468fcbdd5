"""``source.json`` (what ``relay git set`` stored) and ``state.json`` (how the
last sync went). Both 0600, both written atomically; a corrupt file is reported
in one line naming it and how to fix it, never guessed around."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import msgspec

from relay.adapters.git.files import GitPaths, private_dir, write_atomic
from relay.domain.git import GitError, GitSource, make_source


class SyncState(msgspec.Struct, frozen=True, kw_only=True):
    """The last sync attempt (``at``, ``ok``, ``error``) and the last good one."""

    at: float
    ok: bool
    error: str | None = None
    commit: str | None = None  # of the last successful sync
    synced_at: float | None = None  # when that was
    repository: str | None = None
    functions: list[str] = msgspec.field(default_factory=list)


class GitStore:
    """Reads and writes the git sync files under one state directory."""

    def __init__(self, paths: GitPaths) -> None:
        self.paths = paths

    def load_source(self) -> GitSource | None:
        """The configured source, None when there is none; :class:`GitError` when the
        file is corrupt."""
        data = _read(self.paths.source)
        if data is None:
            return None
        try:
            raw = msgspec.json.decode(data, type=GitSource)
            # stored values are validated again: a hand-edited file must not
            # smuggle an option into a git command line
            return make_source(raw.repository, ref=raw.ref, path=raw.path,
                               webhook_secret=raw.webhook_secret)
        except (msgspec.DecodeError, msgspec.ValidationError, GitError) as exc:
            raise GitError(
                f"{self.paths.source} is corrupt ({_first_line(exc)}); "
                "run `relay git set <repository>` again to replace it"
            ) from exc

    def save_source(self, source: GitSource) -> None:
        private_dir(self.paths.git_dir)
        write_atomic(self.paths.source, msgspec.json.format(msgspec.json.encode(source)) + b"\n")

    def remove(self) -> bool:
        """Delete the config, the checkout and the sync state; True when anything was
        there. Fails (like every reader) when ``source.json`` is corrupt."""
        source = self.load_source()
        existed = source is not None or self.paths.checkout.exists()
        if self.paths.checkout.exists():
            shutil.rmtree(self.paths.checkout)
        for path in (self.paths.source, self.paths.state):
            path.unlink(missing_ok=True)
        return existed

    def checkout_commit(self) -> str | None:
        """The commit the checkout is at (detached HEAD), None without a checkout."""
        try:
            head = (self.paths.checkout / ".git" / "HEAD").read_text().strip()
        except OSError:
            return None
        return head if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", head) else None

    def load_state(self) -> SyncState | None:
        data = _read(self.paths.state)
        if data is None:
            return None
        try:
            return msgspec.json.decode(data, type=SyncState)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None  # only informational: the next sync rewrites it

    def save_state(self, state: SyncState) -> None:
        private_dir(self.paths.git_dir)
        write_atomic(self.paths.state, msgspec.json.encode(state) + b"\n")


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise GitError(f"{path} cannot be read: {exc.strerror}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
