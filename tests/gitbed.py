"""A real git-over-SSH server on loopback for the git sync tests.

``GitServer`` runs Debian's ``sshd`` on a free 127.0.0.1 port with a throwaway
host key and its own ``authorized_keys``; every login is forced into
``git-shell`` (so the key can only fetch and push), and public-key login as the
current user (root in CI) is allowed for that one file. Bare repositories live
in the server's directory; tests push to them through the filesystem (no SSH
needed for setting up content) and Relay fetches from them over SSH.

``scripts/testbed`` installs ``openssh-server`` and ``git``; a missing one fails
the test with one line saying so, never a skip.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"
START_TIMEOUT_S = 10.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {
        **os.environ,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.invalid",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.invalid",
    }
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


class BareRepo:
    """A bare repository on the server, and a work tree to commit into it."""

    def __init__(self, bare: Path, work: Path, url: str) -> None:
        self.bare = bare
        self.work = work
        self.url = url
        _git("init", "--quiet", "--bare", "--initial-branch=main", str(bare))
        _git("init", "--quiet", "--initial-branch=main", str(work))

    def commit(
        self,
        files: dict[str, str],
        *,
        remove: tuple[str, ...] = (),
        branch: str = "main",
        message: str = "change",
    ) -> str:
        """Write ``files`` (path -> text) and delete ``remove`` on ``branch``, commit,
        push; the new commit id."""
        current = _git("symbolic-ref", "--short", "HEAD", cwd=self.work)
        if current != branch:
            exists = bool(_git("branch", "--list", branch, cwd=self.work))
            _git("checkout", "--quiet", *([] if exists else ["-b"]), branch, cwd=self.work)
        for rel in remove:
            target = self.work / rel
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()
        for rel, text in files.items():
            target = self.work / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        _git("add", "--all", cwd=self.work)
        _git("commit", "--quiet", "--allow-empty", "-m", message, cwd=self.work)
        _git("push", "--quiet", "--force", str(self.bare), f"HEAD:refs/heads/{branch}",
             cwd=self.work)
        return _git("rev-parse", "HEAD", cwd=self.work)

    def tag(self, name: str) -> str:
        _git("tag", "--force", name, cwd=self.work)
        _git("push", "--quiet", "--force", str(self.bare), f"refs/tags/{name}", cwd=self.work)
        return _git("rev-parse", "HEAD", cwd=self.work)


class GitServer:
    """One sshd serving bare repositories over git-shell."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_port()
        self.user = getpass.getuser()
        self.authorized_keys = root / "authorized_keys"
        self.authorized_keys.write_text("")
        self.authorized_keys.chmod(0o600)
        self.host_key = root / "host_ed25519"
        self.config = root / "sshd_config"
        self.log = root / "sshd.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._repos = 0

    @property
    def host_label(self) -> str:
        return f"127.0.0.1:{self.port}"

    def authorize(self, public_key: str) -> None:
        with self.authorized_keys.open("a") as handle:
            handle.write(public_key.strip() + "\n")

    def repo(self, name: str = "functions") -> BareRepo:
        self._repos += 1
        bare = self.root / "repos" / f"{name}.git"
        url = f"ssh://{self.user}@127.0.0.1:{self.port}{bare}"
        return BareRepo(bare, self.root / f"work-{self._repos}-{name}", url)

    def host_fingerprint(self) -> str:
        out = subprocess.run(
            ["ssh-keygen", "-l", "-E", "sha256", "-f", str(self.host_key)],
            capture_output=True, text=True, check=True,
        ).stdout
        return out.split()[1]

    def start(self, *, new_host_key: bool = False) -> GitServer:
        if not Path(SSHD).is_file() or shutil.which("git-shell") is None:
            pytest.fail("sshd or git-shell missing: run scripts/testbed (installs "
                        "openssh-server and git)", pytrace=False)
        if new_host_key or not self.host_key.exists():
            for path in (self.host_key, self.host_key.with_suffix(".pub")):
                path.unlink(missing_ok=True)
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.host_key)],
                check=True,
            )
        self.config.write_text(self._config())
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        self.log.write_text("")
        with self.log.open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config)],
                stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Server listening" not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"sshd did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def _config(self) -> str:
        git_shell = shutil.which("git-shell")
        return "\n".join([
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.host_key}",
            "PidFile none",
            "UsePAM no",
            # the key file lives under /tmp, which is world-writable
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            f"AuthorizedKeysFile {self.authorized_keys}",
            f"AllowUsers {self.user}",
            f'ForceCommand {git_shell} -c "$SSH_ORIGINAL_COMMAND"',
            "AllowTcpForwarding no",
            "X11Forwarding no",
            "PermitTTY no",
            "",
        ])


@pytest.fixture
def git_server(tmp_path: Path) -> Iterator[GitServer]:
    """A running sshd of this test's own; stopped afterwards."""
    root = tmp_path / "gitserver"
    root.mkdir()
    server = GitServer(root).start()
    try:
        yield server
    finally:
        server.stop()
