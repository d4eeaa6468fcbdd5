"""Git sync rules, without I/O: what a source is, which URLs and refs are
accepted, and which webhook deliveries schedule a sync.

Only SSH sources are accepted, in the two forms git itself understands:
scp-like ``user@host:org/repo.git`` and ``ssh://user@host[:port]/org/repo.git``.
Everything else (https, file, ``git://``, transport helpers such as ``ext::``,
an argument that starts with ``-``, whitespace or control characters) is refused
before it can reach a git command line.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from enum import StrEnum

import msgspec

from relay.domain.errors import RelayError

DEFAULT_REF = "main"
SIGNATURE_PREFIX = "sha256="
MAX_WEBHOOK_BODY_BYTES = 1024 * 1024
"""GitHub caps any payload at 25 MB, but a push payload is a few KiB: it grows only
with the commits and file paths of one push (1 MiB is thousands of changed paths).
The body is unauthenticated until it is read whole, so the cap is what each open
connection may cost. A larger body is refused with 413 (logged and counted);
nothing is lost for long, since every sync fetches the ref's newest commit: the
next push, or `relay git sync`, brings that one in too."""
MAX_WEBHOOK_CONNECTIONS = 16
"""Requests read at once (GitHub sends one request per connection, for one
repository seldom more than a few at a time). With the body cap this bounds what
unauthenticated callers can make the worker hold to about 17 MiB."""
MAX_WEBHOOK_WAITING = 128
"""Connections beyond those that wait, unread, for a turn (a burst of pushes);
one more is closed at accept."""
WEBHOOK_READ_DEADLINE_S = 10.0
"""From accept to the answer: GitHub gives up on a delivery after 10 s."""

class DeliveryOutcome(StrEnum):
    """How a webhook delivery was answered (the ``outcome`` label of
    ``git_webhook_deliveries_total`` and of the ``git_webhook_delivery`` log line)."""

    ACCEPTED = "accepted"  # a push for the source: a sync was scheduled (202)
    IGNORED = "ignored"  # a ping, another event, repository or ref, a deleted ref (200)
    DUPLICATE = "duplicate"  # an X-GitHub-Delivery id already accepted (200, no second sync)
    UNAUTHORIZED = "unauthorized"  # a missing or wrong X-Hub-Signature-256 (401)
    MALFORMED = "malformed"  # not JSON (400)
    TOO_LARGE = "too_large"  # over MAX_WEBHOOK_BODY_BYTES (413)
    UNAVAILABLE = "unavailable"  # the webhook secret cannot be read, or is blank (500)


class GitError(RelayError):
    """A git sync command cannot do what was asked; one line says why."""


class HostKeyChanged(GitError):
    """The SSH server presented a key other than the one pinned for it."""


class RemoteUnreachable(GitError):
    """The SSH server could not be reached at all."""


class GitSource(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What ``relay git set`` stores in ``source.json``."""

    repository: str
    ref: str = DEFAULT_REF
    path: str | None = None
    webhook_secret: str | None = None


@dataclass(frozen=True, slots=True)
class SshUrl:
    """A parsed SSH repository address."""

    user: str | None
    host: str
    port: int | None
    path: str

    @property
    def host_label(self) -> str:
        """How the host is named in messages: ``host`` or ``host:port``."""
        return self.host if self.port in (None, 22) else f"{self.host}:{self.port}"

    def identity(self) -> tuple[str, str]:
        """(host, path) compared case-insensitively, without ``.git`` or slashes, so
        ``git@github.com:Acme/Repo.git`` and ``ssh://git@github.com/acme/repo`` match."""
        path = self.path.strip("/").lower()
        path = path.removesuffix(".git")
        return self.host.lower(), path


_USER = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]"
_PATH = r"[^\s\x00-\x1f\x7f]+"
_SSH_FORM = re.compile(rf"ssh://(?:(?P<user>{_USER})@)?(?P<host>{_HOST})(?::(?P<port>\d{{1,5}}))?"
                       rf"(?P<path>/{_PATH})")
_SCP_FORM = re.compile(rf"(?:(?P<user>{_USER})@)?(?P<host>{_HOST}):(?P<path>{_PATH})")
_URL_ACCEPTS = "use git@host:org/repo.git or ssh://git@host[:port]/org/repo.git"


def parse_ssh_url(text: str) -> SshUrl:
    """Validate an SSH repository URL or raise :class:`GitError` naming the problem."""
    shown = _shown(text)
    if not text:
        raise GitError(f"repository is empty: {_URL_ACCEPTS}")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise GitError(f"repository {shown} contains whitespace or control characters")
    if text.startswith("-"):
        raise GitError(f"repository {shown} starts with '-': {_URL_ACCEPTS}")
    if re.match(r"[A-Za-z0-9+.-]*::", text):
        raise GitError(f"repository {shown} names a git transport helper: only SSH is supported")
    if "://" in text and not text.startswith("ssh://"):
        scheme = text.split("://", 1)[0]
        raise GitError(f"repository {shown} uses {scheme}://: only SSH is supported, "
                       f"{_URL_ACCEPTS}")
    match = _SSH_FORM.fullmatch(text) if text.startswith("ssh://") else _SCP_FORM.fullmatch(text)
    if match is None or match["path"].startswith("-") or "/-" in match["path"]:
        raise GitError(f"repository {shown} is not an SSH URL: {_URL_ACCEPTS}")
    port = int(match["port"]) if match.groupdict().get("port") else None
    if port is not None and not 1 <= port <= 65535:
        raise GitError(f"repository {shown} has an invalid port {port}")
    return SshUrl(user=match["user"], host=match["host"].strip("[]"), port=port,
                  path=match["path"])


_REF = re.compile(r"[A-Za-z0-9._/-]+")


def validate_ref(ref: str) -> str:
    """A branch, tag or commit: the characters of git's ref names that need no
    quoting, no leading ``-`` or ``/``, no ``..``, no trailing ``/`` or ``.lock``."""
    if (
        not _REF.fullmatch(ref)
        or ref.startswith(("-", "/", "."))
        or ref.endswith(("/", ".", ".lock"))
        or ".." in ref
        or "//" in ref
    ):
        raise GitError(f"ref {_shown(ref)} is not a branch, tag or commit name "
                       "(letters, digits, '.', '_', '-', '/'; no leading '-', no '..')")
    return ref


def validate_path(path: str) -> str:
    """A relative directory inside the repository, normalised without ``./`` or a
    trailing slash; never absolute, never ``..``."""
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in path):
        raise GitError(f"path {_shown(path)} contains whitespace or control characters")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or not parts or ".." in parts or parts[0].startswith("-"):
        raise GitError(f"path {_shown(path)} must be a relative directory inside the "
                       "repository (no leading '/', no '..')")
    return "/".join(parts)


def make_source(
    repository: str, *, ref: str = DEFAULT_REF, path: str | None = None,
    webhook_secret: str | None = None,
) -> GitSource:
    """A validated :class:`GitSource` (the secret name is validated by the store)."""
    parse_ssh_url(repository)
    return GitSource(
        repository=repository,
        ref=validate_ref(ref),
        path=validate_path(path) if path is not None else None,
        webhook_secret=webhook_secret,
    )


def ref_candidates(ref: str) -> list[str]:
    """Local names to try, in order, after fetching every branch (into
    ``refs/remotes/origin``) and every tag: a branch first, then a tag, then a
    commit id."""
    if ref.startswith("refs/heads/"):
        return ["refs/remotes/origin/" + ref.removeprefix("refs/heads/")]
    if ref.startswith("refs/tags/"):
        return [ref]
    found = [f"refs/remotes/origin/{ref}", f"refs/tags/{ref}"]
    if re.fullmatch(r"[0-9a-fA-F]{4,64}", ref):
        found.append(ref)
    return found


def signature_valid(secret: str, body: bytes, header: str | None) -> bool:
    """GitHub's ``X-Hub-Signature-256``: ``sha256=`` + hex HMAC of the raw body,
    compared in constant time. A missing or malformed header is invalid."""
    if not header or not header.startswith(SIGNATURE_PREFIX) or not secret.strip():
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest().encode()
    # bytes on both sides: compare_digest refuses a str with non-ASCII characters
    given = header.removeprefix(SIGNATURE_PREFIX).strip().lower()
    return hmac.compare_digest(expected, given.encode("utf-8", "surrogateescape"))


class SyncSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What a successful sync did, for logs and events."""

    commit: str
    functions: int
    updated: list[str] = msgspec.field(default_factory=list)
    removed: list[str] = msgspec.field(default_factory=list)


class GitSyncResult(msgspec.Struct, frozen=True, kw_only=True):
    """What ``SyncGit`` answers (over the control socket too): the source and
    commit now served in ``directory``, and the ``trusted`` lines of a first
    connection to the git host (``relay git sync`` prints them)."""

    repository: str
    ref: str
    commit: str
    directory: str
    functions: list[str] = msgspec.field(default_factory=list)
    updated: list[str] = msgspec.field(default_factory=list)
    removed: list[str] = msgspec.field(default_factory=list)
    trusted: list[str] = msgspec.field(default_factory=list)

    def summary(self) -> SyncSummary:
        return SyncSummary(commit=self.commit, functions=len(self.functions),
                           updated=self.updated, removed=self.removed)


@dataclass(frozen=True, slots=True)
class PushDecision:
    """Whether a delivery schedules a sync, and a short reason for the reply and log."""

    schedule: bool
    reason: str


def push_decision(event: str | None, payload: object, source: GitSource) -> PushDecision:
    """Only a ``push`` to the configured repository and ref that did not delete it."""
    if event == "ping":
        return PushDecision(False, "ping")
    if event != "push":
        return PushDecision(False, f"event {event or '(none)'} ignored")
    body = payload if isinstance(payload, dict) else {}
    checks = (
        (isinstance(payload, dict), "payload is not an object"),
        (body.get("deleted") is not True, "deleted ref ignored"),
        (_same_repository(body.get("repository"), source.repository), "other repository ignored"),
        (_same_ref(body.get("ref"), source.ref), "other ref ignored"),
    )
    for passed, reason in checks:
        if not passed:
            return PushDecision(False, reason)
    return PushDecision(True, "push accepted")


def _same_repository(repository: object, configured: str) -> bool:
    if not isinstance(repository, dict):
        return False
    want = parse_ssh_url(configured).identity()
    for key in ("ssh_url", "clone_url", "git_url", "html_url", "url"):
        value = repository.get(key)
        if isinstance(value, str) and _identity_of_any(value) == want:
            return True
    return False


def _identity_of_any(url: str) -> tuple[str, str] | None:
    """(host, path) of an ssh, https or git URL as GitHub's payload spells them."""
    try:
        return parse_ssh_url(url).identity()
    except GitError:
        pass
    match = re.fullmatch(r"(?:https?|git)://(?:[^@/]+@)?([^/:]+)(?::\d+)?(/.+)", url)
    if match is None:
        return None
    return SshUrl(None, match[1], None, match[2]).identity()


def _same_ref(pushed: object, configured: str) -> bool:
    if not isinstance(pushed, str):
        return False
    if configured.startswith("refs/"):
        return pushed == configured
    return pushed in (f"refs/heads/{configured}", f"refs/tags/{configured}")


def _shown(text: str) -> str:
    """A user's input echoed safely: repr (control characters escaped), capped."""
    return repr(text if len(text) <= 200 else text[:200] + "...")
