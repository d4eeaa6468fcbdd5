"""Whether ``relay start`` has anything to serve, checked before it starts.

A worker whose functions directory is missing or unreadable, with no git source
that could fill it, would consume events it can never run: they are held (leased
or pending) while ``relay stats`` and ``relay health`` looked as if all were well.
It refuses to start instead, with one line naming the cause (issue 35.2); a
supervisor's restart loop then shows the problem where an operator looks. With a
git source configured the directory is the sync's to create, so a missing one is
only the first sync not having run yet: the worker starts and waits for it, and
``relay health`` fails naming the directory until it is there (as it does when
the directory goes away under a running worker).
"""

from __future__ import annotations

from pathlib import Path

from relay.adapters.fs.functions_dir import unreadable
from relay.adapters.git.files import GitPaths
from relay.adapters.git.store import GitStore
from relay.domain.errors import ConfigError, RelayError

__all__ = ["NothingToServe", "require_something_to_serve"]


class NothingToServe(ConfigError):
    """The functions directory cannot be read and no git source could fill it."""


def require_something_to_serve(functions_dir: Path, state_dir: Path) -> None:
    """Return when the worker has functions to serve (or a git source to fetch
    them); raise :class:`NothingToServe` with one line otherwise."""
    problem = unreadable(functions_dir)
    if problem is None or _git_source_configured(state_dir):
        return
    raise NothingToServe(
        f"functions directory {functions_dir} {problem}: nothing to serve (mount it, "
        "pass --functions DIR, or configure a git source with 'relay git set')"
    )


def _git_source_configured(state_dir: Path) -> bool:
    try:
        return GitStore(GitPaths(state_dir)).load_source() is not None
    except RelayError:
        return True  # a broken source file is the git status's to report, not a refusal
