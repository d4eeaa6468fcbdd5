"""The worker's key for the services' ``relay.env_hash`` labels (see docs/services.md)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

KEY_BYTES = 32


def load_env_key(path: Path) -> bytes:
    """The worker's key for ``relay.env_hash`` (32 random bytes, mode 0600),
    created on first use and kept so a restart does not replace every replica."""
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = b""
    if len(key) >= KEY_BYTES:
        return key
    key = secrets.token_bytes(KEY_BYTES)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    # created 0600: the key is never readable by others, not even for a moment
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key)
    tmp.replace(path)
    return key
