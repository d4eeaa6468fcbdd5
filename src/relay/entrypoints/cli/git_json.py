"""``relay git status --json`` and the ``git`` part of ``relay health --json``.

Never key material: the deploy key is ``present`` and its public fingerprint. The
shapes are ``docs/schemas/git.status.v1.json`` and the ``git`` property of
``health.v1.json``; instants are RFC3339 UTC.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relay.adapters.git.files import GitPaths
    from relay.adapters.git.store import GitStore, SyncState
    from relay.domain.git import GitSource


def status_document(paths: GitPaths, store: GitStore, source: GitSource | None) -> dict[str, Any]:
    """``relay.git.status/1``: the source (``null`` when none), key, checkout, last sync."""
    from relay.adapters.git.keys import public_key_fingerprint

    present = paths.private_key.is_file()
    commit = store.checkout_commit() if source is not None else None
    return {
        "configured": source is not None,
        "source": None
        if source is None
        else {
            "repository": source.repository,
            "ref": source.ref,
            "path": source.path,
            "webhook_secret": source.webhook_secret,
        },
        "deploy_key": {
            "present": present,
            "fingerprint": (public_key_fingerprint(paths) or None) if present else None,
        },
        "checkout": {"present": bool(commit), "commit": commit or None},
        "last_sync": sync_document(store.load_state()) if source is not None else None,
    }


def sync_document(state: SyncState | None) -> dict[str, Any] | None:
    """The last sync attempt; ``null`` when there was none."""
    if state is None:
        return None
    return {
        "at": _stamp(state.at),
        "ok": state.ok,
        "error": state.error,
        "commit": state.commit,
        "last_good_at": None if state.synced_at is None else _stamp(state.synced_at),
        "functions": list(state.functions),
    }


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
