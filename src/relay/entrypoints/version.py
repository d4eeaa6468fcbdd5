"""What ``relay --version`` prints: the package version, and the commit when known.

The commit comes from ``RELAY_COMMIT`` (the Relay image bakes it in at build time, the
same value as its ``org.opencontainers.image.revision`` label), or else, when Relay runs
from a git checkout (an editable install), from that checkout itself."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

GIT_TIMEOUT_S = 2.0


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's ``version``)."""
    try:
        return metadata.version("relay")
    except metadata.PackageNotFoundError:  # a bare source tree on sys.path
        return "unknown"


def checkout_commit(source: Path) -> str:
    """The short commit of the git checkout holding ``source``, or "" when it is none."""
    try:
        found = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):  # no git here, or it hangs: no commit
        return ""
    return found.stdout.strip() if found.returncode == 0 else ""


def version_line(env: Mapping[str, str], source: Path | None = None) -> str:
    """``relay 0.1.0`` or ``relay 0.1.0 (commit 0123abcd4567)``."""
    commit = env.get("RELAY_COMMIT", "").strip()
    if not commit:
        commit = checkout_commit(source or Path(__file__).resolve().parent)
    line = f"relay {package_version()}"
    return f"{line} (commit {commit})" if commit else line
