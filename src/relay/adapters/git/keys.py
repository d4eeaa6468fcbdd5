"""The deploy key: one ed25519 key pair generated with asyncssh.

The private half is written atomically with mode 0600 into a 0700 directory and
never printed; the public half is written beside it (``id_ed25519.pub``) so it
can be shown again, and is what ``relay git keygen`` prints.
"""

from __future__ import annotations

import socket

import asyncssh

from relay.adapters.git.files import GitPaths, private_dir, write_atomic
from relay.domain.git import GitError


def generate_deploy_key(paths: GitPaths, *, force: bool = False) -> str:
    """Write a new key pair; return the public key line. Refuses to replace an
    existing private key unless ``force``."""
    if paths.private_key.exists() and not force:
        raise GitError(
            f"a deploy key already exists at {paths.private_key}; "
            "use --force to replace it (the old public key stops working)"
        )
    private_dir(paths.ssh_dir)
    key = asyncssh.generate_private_key("ssh-ed25519", comment=f"relay@{socket.gethostname()}")
    public = key.export_public_key("openssh")
    write_atomic(paths.private_key, key.export_private_key("openssh"), 0o600)
    write_atomic(paths.public_key, public, 0o644)
    return public.decode().strip()


def public_key_fingerprint(paths: GitPaths) -> str | None:
    """``SHA256:...`` of the deploy key, or None when there is none (or it is unreadable)."""
    try:
        return str(asyncssh.read_public_key(str(paths.public_key)).get_fingerprint("sha256"))
    except (OSError, asyncssh.KeyImportError):
        return None


def fingerprint_of(key_type: str, key_base64: str) -> str:
    """``SHA256:...`` of a public key as a known_hosts line holds it."""
    key = asyncssh.import_public_key(f"{key_type} {key_base64}")
    return str(key.get_fingerprint("sha256"))
