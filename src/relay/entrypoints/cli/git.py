"""``relay git keygen|set|sync|status|remove``: functions from an SSH git repository.

Every refusal is one line on stderr with exit 1; nothing here ever prints key
material (``keygen`` prints the public key, which is meant to be shared).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from relay.entrypoints.cli.common import fail, note, out
from relay.entrypoints.cli.json_output import JsonFlag, emit_json

if TYPE_CHECKING:
    from relay.adapters.git.files import GitPaths
    from relay.adapters.git.store import SyncState
    from relay.domain.git import GitSyncResult

app = typer.Typer(help="Sync /functions from a git repository.", no_args_is_help=True)


def _paths() -> GitPaths:
    from relay.adapters.git.files import GitPaths
    from relay.entrypoints.config import load_paths

    return GitPaths(load_paths(os.environ).state_dir)


@app.command("keygen")
def keygen(
    force: Annotated[bool, typer.Option("--force", help="Replace an existing key.")] = False,
) -> None:
    """Generate the SSH deploy key (ed25519) and print its public half."""
    from relay.adapters.git.keys import generate_deploy_key
    from relay.domain.errors import RelayError

    paths = _paths()
    try:
        public = generate_deploy_key(paths, force=force)
    except RelayError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write the deploy key: {exc.strerror} ({exc.filename})")
    out(f"Deploy key written to {paths.private_key}")
    out("Add this public key as a read-only deploy key of the repository")
    out("(GitHub: the repository's Settings > Deploy keys > Add deploy key):")
    out()
    out(public)


@app.command("set")
def set_(
    repository: Annotated[
        str, typer.Argument(metavar="REPOSITORY", help="git@host:org/repo.git or ssh://...")
    ],
    ref: Annotated[
        str, typer.Option("--ref", metavar="REF", help="Branch, tag or commit.")
    ] = "main",
    path: Annotated[
        str | None, typer.Option(
            "--path", metavar="DIR", help="Directory of the functions in the repository."
        )
    ] = None,
    webhook_secret: Annotated[
        str | None,
        typer.Option(
            "--webhook-secret",
            metavar="SECRET",
            help="Name of the secret that signs webhook deliveries.",
        ),
    ] = None,
) -> None:
    """Set the SSH git source to sync from (replaces any previous one)."""
    from relay.adapters.fs.secrets import FileSecretStore, validate_secret_name
    from relay.adapters.git.store import GitStore
    from relay.domain.errors import RelayError
    from relay.domain.git import make_source
    from relay.entrypoints.config import load_paths

    paths = _paths()
    try:
        if webhook_secret is not None:
            validate_secret_name(webhook_secret)
            _refuse_a_blank_secret(webhook_secret)
        source = make_source(repository, ref=ref, path=path, webhook_secret=webhook_secret)
        GitStore(paths).save_source(source)
    except RelayError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {paths.source}: {exc.strerror}")
    where = f", path {source.path}" if source.path else ""
    out(f"Git source set: {source.repository} (ref {source.ref}{where})")
    if webhook_secret is not None:
        store = FileSecretStore(load_paths(os.environ).secrets_dir)
        try:
            known = store.names()
        except (RelayError, OSError):
            known = []  # only a hint: `relay secret ls` reports the store's problem
        if webhook_secret not in known:
            out(f"note: secret {webhook_secret!r} is not set yet: "
                f"run `relay secret set {webhook_secret}`")
    out("Run `relay git sync` to update the functions; a running worker's webhook "
        "picks up a new source at its next restart.")


def _refuse_a_blank_secret(name: str) -> None:
    """A stored webhook secret that is empty or whitespace is an HMAC key anyone
    can sign with; one not stored yet is only a note (it may be set next)."""
    from relay.adapters.fs.secrets import FileSecretStore
    from relay.domain.errors import RelayError
    from relay.entrypoints.config import load_paths

    try:
        value = FileSecretStore(load_paths(os.environ).secrets_dir).get(name)
    except (RelayError, OSError):
        return  # missing or unreadable: the note below, and `relay secret ls`, say so
    if not value.strip():
        fail(f'secret "{name}" is empty or only whitespace: a webhook signed with it '
             f"proves nothing; set a random value with `relay secret set {name}` first")


SYNC_TIMEOUT_S = 900.0
"""How long ``relay git sync`` waits for a running worker's sync (a fetch included)."""


@app.command("sync")
def sync(
    functions: Annotated[
        Path | None, typer.Option(
            "--functions", metavar="DIR",
            help="Functions directory (default: the running worker's, else /functions).",
        )
    ] = None,
) -> None:
    """Fetch the source and make the functions directory exactly its functions."""
    from relay.domain.errors import RelayError

    offline = False
    try:
        result = _sync_on_worker(functions)
        if result is None:  # no worker runs: this process syncs
            offline = True
            result = _sync_here(functions or Path("/functions"))
    except RelayError as exc:
        fail(str(exc))
    for line in result.trusted:
        out(line)
    out(f"Synced {result.repository} {result.ref} at {result.commit[:12]} into "
        f"{result.directory}: {len(result.functions)} function(s)")
    for label, names in (("updated", result.updated), ("removed", result.removed)):
        if names:
            out(f"  {label}: {', '.join(names)}")
    if offline:
        note("no worker is running: synced in this process")


def _sync_on_worker(functions: Path | None) -> GitSyncResult | None:
    """``SyncGit`` over the control socket; None when no worker runs. A running
    worker syncs its own functions directory (and owns the reload that follows)."""
    import msgspec

    from relay.adapters.control.client import WorkerUnavailable, request
    from relay.domain.commands import SyncGit
    from relay.domain.git import GitSyncResult
    from relay.entrypoints.config import load_paths

    directory = None if functions is None else str(functions.absolute())
    command = SyncGit(trigger="cli", directory=directory)
    try:
        answer = request(load_paths(os.environ).socket, command, timeout=SYNC_TIMEOUT_S)
    except WorkerUnavailable as exc:
        if exc.absent:
            return None
        raise
    try:
        return msgspec.convert(answer, GitSyncResult)
    except msgspec.ValidationError:
        fail("the worker's answer is malformed")


def _sync_here(functions: Path) -> GitSyncResult:
    """The offline sync: a newly trusted host is printed as it is trusted (a sync
    that fails later still said so), so the result carries none."""
    import msgspec

    from relay.adapters.git.ssh import TrustedHost
    from relay.adapters.git.sync import GitSyncService

    def trusted(host: TrustedHost) -> None:
        out(host.message())

    service = GitSyncService(_paths(), functions, clock=time.time, on_trusted=trusted)
    result = anyio.run(service.sync_functions)
    return msgspec.structs.replace(result, trusted=[])


@app.command("status")
def status(as_json: JsonFlag = False) -> None:
    """Show the source, the key and checkout, and the last sync (never key material)."""
    from relay.adapters.git.keys import public_key_fingerprint
    from relay.adapters.git.store import GitStore
    from relay.domain.errors import RelayError

    paths = _paths()
    store = GitStore(paths)
    try:
        source = store.load_source()
    except RelayError as exc:
        fail(str(exc))
    if as_json:
        from relay.entrypoints.cli.git_json import status_document

        emit_json("git.status", status_document(paths, store, source))
        return
    if source is None:
        out("No git source configured.")
        return
    fingerprint = public_key_fingerprint(paths)
    key = ("present" + (f" ({fingerprint})" if fingerprint else "")
           if paths.private_key.is_file() else "missing: run `relay git keygen`")
    commit = store.checkout_commit()
    state = store.load_state()
    rows = [
        ("Repository", source.repository),
        ("Ref", source.ref),
        ("Path", source.path or "(repository root)"),
        ("Webhook secret", source.webhook_secret or "none (deliveries are unauthenticated)"),
        ("Deploy key", f"{key}"),
        ("Checkout", "present" if commit else "none yet"),
        ("Commit", commit or "-"),
        ("Last sync", _last_sync(state)),
    ]
    for label, value in rows:
        out(f"{label + ':':<16}{value}")


def _last_sync(state: SyncState | None) -> str:
    if state is None:
        return "never"
    when = _stamp(state.at)
    if state.ok:
        return f"{when} ok ({len(state.functions)} function(s))"
    good = f"; last good sync {_stamp(state.synced_at)}" if state.synced_at else ""
    return f"{when} failed: {state.error}{good}"


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


@app.command("remove")
def remove() -> None:
    """Forget the source and delete the checkout (keeps the key and /functions)."""
    from relay.adapters.git.store import GitStore
    from relay.adapters.git.sync import sync_lock
    from relay.domain.errors import RelayError

    paths = _paths()
    try:
        with sync_lock(paths):  # never delete the checkout under a running sync
            removed = GitStore(paths).remove()
    except RelayError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot remove the git source: {exc.strerror} ({exc.filename})")
    if not removed:
        out("No git source configured.")
        return
    out("Git source removed; the deploy key and the functions directory were kept.")


def health_git() -> dict[str, object] | None:
    """``relay health --json``'s ``git`` object, ``None`` without a git source.
    Informational, like :func:`health_line`: a broken source file is its ``error``."""
    from relay.adapters.git.store import GitStore
    from relay.domain.errors import RelayError
    from relay.entrypoints.cli.git_json import sync_document

    store = GitStore(_paths())
    try:
        if store.load_source() is None:
            return None
    except RelayError as exc:
        return {"commit": None, "last_sync": None, "error": str(exc)}
    state = store.load_state()
    commit = state.commit if state and state.commit else None
    return {"commit": commit, "last_sync": sync_document(state), "error": None}


def health_line() -> str | None:
    """``relay health``'s git line: the commit served and the last sync, or None
    when no git source is configured. Informational: it never fails the check."""
    from relay.adapters.git.store import GitStore
    from relay.domain.errors import RelayError

    store = GitStore(_paths())
    try:
        if store.load_source() is None:
            return None
    except RelayError as exc:
        return f"git: {exc}"
    state = store.load_state()
    commit = state.commit if state and state.commit else None
    served = f"commit {commit}" if commit else "not synced yet"
    return f"git: {served}; last sync {_last_sync(state)}"
