"""The managed checkout: fetch the source and check out its ref, detached.

Never a pull and never a merge: every sync fetches all branches and tags
(``--force --prune``), resolves the ref (branch, then tag, then commit id), and
checks it out detached with a hard reset and a clean, so the checkout is exactly
the commit and nothing else. A checkout of another repository is deleted and
cloned afresh. Every git call runs with the operator's git configuration
ignored and only the SSH transport allowed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from relay.adapters.git.files import GitPaths, private_dir
from relay.adapters.git.ssh import (
    TrustedHost,
    explain_failure,
    newly_trusted,
    prepare_known_hosts,
    ssh_command,
)
from relay.domain.git import GitError, GitSource, parse_ssh_url, ref_candidates

FETCH_TIMEOUT_S = 300.0
LOCAL_TIMEOUT_S = 60.0
_SAFE_GIT = [
    "-c", "protocol.allow=never", "-c", "protocol.ssh.allow=always",
    "-c", "core.hooksPath=/dev/null", "-c", "advice.detachedHead=false",
    "-c", "core.fsmonitor=false", "-c", "gc.auto=0",
]


@dataclass(frozen=True, slots=True)
class CheckoutResult:
    commit: str
    trusted: list[TrustedHost] = field(default_factory=list)


def git_env(paths: GitPaths) -> dict[str, str]:
    """No system or global git config, no prompts, English messages, our ssh."""
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(paths.git_dir),
        "LANG": "C",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_SSH_COMMAND": ssh_command(paths),
        "GIT_SSH_VARIANT": "ssh",
        # a broken checkout must never make git find a repository above it
        "GIT_CEILING_DIRECTORIES": str(paths.git_dir),
    }


class GitCheckout:
    """Brings ``paths.checkout`` to the source's ref."""

    def __init__(self, paths: GitPaths) -> None:
        self.paths = paths
        self._env = git_env(paths)

    async def update(self, source: GitSource) -> CheckoutResult:
        url = parse_ssh_url(source.repository)
        if shutil.which("git") is None:
            raise GitError("git is not installed (it is needed for git sync)")
        await self._ensure_clone(source.repository)
        before = prepare_known_hosts(self.paths)
        try:
            code, _, err = await self._git(
                "fetch", "--quiet", "--force", "--prune", "--no-tags", "origin",
                "+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*",
                limit_s=FETCH_TIMEOUT_S,
            )
        finally:
            trusted = newly_trusted(self.paths, before)
        if code != 0:
            raise explain_failure(err, url, self.paths.known_hosts, "git fetch")
        commit = await self._resolve(source)
        for args in (
            ("checkout", "--quiet", "--force", "--detach", commit),
            ("reset", "--quiet", "--hard", commit),
            ("clean", "-q", "-ffdx"),
        ):
            code, _, err = await self._git(*args)
            if code != 0:
                raise GitError(f"git {args[0]} failed: {_last(err)}")
        return CheckoutResult(commit=commit, trusted=trusted)

    async def head(self) -> str | None:
        """The checked-out commit, or None without a usable checkout."""
        if not (self.paths.checkout / ".git").is_dir():
            return None
        code, out, _ = await self._git("rev-parse", "--verify", "--quiet", "HEAD")
        return out.strip() if code == 0 and out.strip() else None

    async def _ensure_clone(self, repository: str) -> None:
        checkout = self.paths.checkout
        if checkout.exists():
            code, out, _ = await self._git("config", "--get", "remote.origin.url")
            if code == 0 and out.strip() == repository:
                return
            # another repository (or a broken checkout): start afresh
            await anyio.to_thread.run_sync(shutil.rmtree, checkout)
        private_dir(self.paths.git_dir)
        staging = checkout.with_name(checkout.name + ".new")
        if staging.exists():
            await anyio.to_thread.run_sync(shutil.rmtree, staging)
        for args in (("init", "--quiet", str(staging)),
                     ("-C", str(staging), "remote", "add", "origin", repository)):
            code, _, err = await self._git(*args, cwd=self.paths.git_dir)
            if code != 0:
                raise GitError(f"git {args[0]} failed: {_last(err)}")
        staging.rename(checkout)

    async def _resolve(self, source: GitSource) -> str:
        for candidate in ref_candidates(source.ref):
            code, out, _ = await self._git(
                "rev-parse", "--verify", "--quiet", "--end-of-options", f"{candidate}^{{commit}}"
            )
            if code == 0 and out.strip():
                return out.strip()
        raise GitError(
            f"ref {source.ref!r} is not a branch, tag or commit of {source.repository}"
        )

    async def _git(
        self, *args: str, limit_s: float = LOCAL_TIMEOUT_S, cwd: Path | None = None
    ) -> tuple[int, str, str]:
        argv = ["git", *_SAFE_GIT, *args]
        try:
            with anyio.fail_after(limit_s):
                done = await anyio.run_process(
                    argv, cwd=cwd or self.paths.checkout, env=self._env, check=False,
                    stdin=subprocess.DEVNULL,
                )
        except TimeoutError:
            raise GitError(f"git {args[0]} took longer than {limit_s:.0f}s") from None
        except OSError as exc:
            raise GitError(f"git {args[0]} could not run: {exc.strerror}") from exc
        return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(
            errors="replace"
        )


def _last(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
