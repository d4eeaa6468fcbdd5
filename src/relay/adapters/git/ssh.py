"""SSH for git: the deploy key, and Relay's own known_hosts by trust on first use.

git runs OpenSSH with ``GIT_SSH_COMMAND`` set to a command that reads no
configuration of the operator's (``-F /dev/null``), offers only the deploy key,
never asks anything (``BatchMode``), and checks host keys against Relay's file
only (``GlobalKnownHostsFile=/dev/null``). ``StrictHostKeyChecking=accept-new``
is OpenSSH's TOFU: an unknown host's key is pinned, a pinned key that changed
fails the connection and is never replaced. ``ssh-keyscan`` is never needed.

What ssh says on stderr is turned into one line here: a changed host key, an
unreachable host or a refused key each get their own message.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from relay.adapters.git.files import GitPaths, private_dir
from relay.adapters.git.keys import fingerprint_of
from relay.domain.git import GitError, HostKeyChanged, RemoteUnreachable, SshUrl

CONNECT_TIMEOUT_S = 15


def ssh_command(paths: GitPaths) -> str:
    """The ``GIT_SSH_COMMAND`` value (a shell word list, quoted)."""
    argv = [
        "ssh", "-F", "/dev/null",
        "-i", str(paths.private_key),
        "-o", "IdentitiesOnly=yes",
        "-o", "IdentityAgent=none",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=accept-new",
        "-o", f"UserKnownHostsFile={paths.known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "UpdateHostKeys=no",
        "-o", "HashKnownHosts=no",
        "-o", "CheckHostIP=no",
        "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o", "ServerAliveInterval=15",
        "-o", "LogLevel=ERROR",
    ]
    return shlex.join(argv)


@dataclass(frozen=True, slots=True)
class TrustedHost:
    """A host key pinned by this sync (its first)."""

    host: str
    fingerprint: str

    def message(self) -> str:
        return f"Trusted new host {self.host} (fingerprint {self.fingerprint})"


def prepare_known_hosts(paths: GitPaths) -> list[str]:
    """Make sure the file exists (0600) and return its lines before a connection."""
    private_dir(paths.ssh_dir)
    path = paths.known_hosts
    if not path.exists():
        path.touch(mode=0o600)
    path.chmod(0o600)
    return path.read_text().splitlines()


def newly_trusted(paths: GitPaths, before: list[str]) -> list[TrustedHost]:
    """The lines ssh appended since ``before``, as hosts and fingerprints."""
    try:
        after = paths.known_hosts.read_text().splitlines()
    except FileNotFoundError:
        return []
    seen = set(before)
    trusted = []
    for line in after:
        fields = line.split()
        if line in seen or len(fields) < 3 or line.startswith("#"):
            continue
        try:
            fingerprint = fingerprint_of(fields[1], fields[2])
        except ValueError:  # asyncssh.KeyImportError: an odd line is shown as such
            fingerprint = "(unreadable key)"
        trusted.append(TrustedHost(_host_of(fields[0]), fingerprint))
    return trusted


def _host_of(pattern: str) -> str:
    """``[127.0.0.1]:2222`` -> ``127.0.0.1:2222``; ``github.com`` unchanged."""
    match = re.fullmatch(r"\[(.+)\]:(\d+)", pattern)
    return f"{match[1]}:{match[2]}" if match else pattern


_CHANGED = "REMOTE HOST IDENTIFICATION HAS CHANGED"
_UNREACHABLE = (
    "Connection refused", "Could not resolve hostname", "Connection timed out",
    "No route to host", "Network is unreachable", "Operation timed out",
    "Name or service not known", "Temporary failure in name resolution",
    "Connection closed by", "Connection reset by",
)


def explain_failure(stderr: str, url: SshUrl, known_hosts: Path, what: str) -> GitError:
    """One line for what went wrong with ``what`` (e.g. ``git fetch``)."""
    if _CHANGED in stderr:
        match = re.search(r"(SHA256:[A-Za-z0-9+/=]+)", stderr)
        now = f" (it now presents {match[1]})" if match else ""
        return HostKeyChanged(
            f"WARNING: the SSH host key of {url.host_label} has changed{now}: someone may "
            "be intercepting the connection (man-in-the-middle), so nothing was synced. "
            f"If the server's key was rotated on purpose, delete its line from {known_hosts} "
            "and sync again"
        )
    if "Host key verification failed" in stderr:
        return HostKeyChanged(
            f"the SSH host key of {url.host_label} could not be verified against "
            f"{known_hosts}; nothing was synced"
        )
    if "Permission denied (publickey" in stderr:
        return GitError(
            f"{url.host_label} refused the deploy key: add the public key "
            "(`relay git keygen` printed it) as a read-only deploy key of the repository"
        )
    for marker in _UNREACHABLE:
        if marker in stderr:
            return RemoteUnreachable(f"cannot reach {url.host_label}: {_line_with(stderr, marker)}")
    return GitError(f"{what} failed: {_last_line(stderr)}")


def _line_with(text: str, marker: str) -> str:
    for line in text.splitlines():
        if marker in line:
            return line.strip().removeprefix("ssh: ")
    return marker


def _last_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    meaningful = [
        line for line in lines
        if not line.startswith(("Please make sure", "and the repository exists"))
        and "Could not read from remote repository" not in line
    ]
    chosen = (meaningful or lines or ["no output"])[-1]
    return chosen.removeprefix("fatal: ").removeprefix("error: ")
