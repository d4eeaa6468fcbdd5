"""``relay secret ls|set|rm``: the local secret store.

Values are read from a hidden prompt (a terminal) or all of stdin (a pipe) and
are never echoed or printed; only names are shown. A value must be UTF-8 text
without NUL bytes (it becomes an environment variable); anything else is refused
with one line naming the secret.
"""

from __future__ import annotations

import getpass
import os
import sys
from typing import Annotated

import typer

from relay.adapters.fs.secrets import FileSecretStore, decode_secret_value, validate_secret_name
from relay.domain.errors import RelayError
from relay.entrypoints.cli.common import fail, out, state_dir_problem
from relay.entrypoints.cli.json_output import JsonFlag, emit_json
from relay.entrypoints.config import load_paths

app = typer.Typer(help="Manage local secrets.", no_args_is_help=True)


def _store() -> FileSecretStore:
    return FileSecretStore(load_paths(os.environ).secrets_dir)


@app.command("ls")
def ls(as_json: JsonFlag = False) -> None:
    """List secret names (never values)."""
    problem = state_dir_problem(load_paths(os.environ).state_dir)
    if problem is not None:  # not an empty table: that reads as "no secrets here"
        fail(problem)
    try:
        names = _store().names()
    except (RelayError, OSError) as exc:
        fail(_one_line(exc))
    if as_json:
        emit_json("secret.ls", {"secrets": list(names)})
        return
    out("NAME")
    for name in names:
        out(name)


SecretName = Annotated[str, typer.Argument(metavar="NAME", help="The secret's name.")]


@app.command("set")
def set_(
    name: SecretName,
    allow_empty: Annotated[
        bool, typer.Option("--allow-empty", help="Store an empty value instead of refusing it.")
    ] = False,
) -> None:
    """Set a secret from a hidden prompt, or from all of stdin when it is not a terminal.

    An empty or whitespace-only value is refused (an empty pipe, `echo $UNSET |`
    or a stray Enter is almost always a mistake that would blank a working
    credential, and as a webhook secret it is a key anyone can sign with) unless
    --allow-empty is given."""
    try:
        validate_secret_name(name)  # before asking for a value it would refuse anyway
        value = _read_value(name)
        if not value.strip() and not allow_empty:
            what = "empty" if value == "" else "only whitespace"
            fail(
                f'secret "{name}": the value is {what}; nothing changed '
                "(pass --allow-empty to store an empty value)"
            )
        _store().set(name, value)
    except (RelayError, OSError) as exc:
        fail(_one_line(exc))
    except (EOFError, KeyboardInterrupt):
        fail("no value given; secret not changed")


@app.command("rm")
def rm(name: SecretName) -> None:
    """Remove a secret."""
    try:
        _store().remove(name)
    except (RelayError, OSError) as exc:
        fail(_one_line(exc))


def _read_value(name: str) -> str:
    # stdin verbatim when piped (``printf 'v' | relay secret set n``); a prompt
    # with echo disabled on a terminal
    if sys.stdin.isatty():
        return getpass.getpass(f"Value for {name}: ")
    # bytes, decoded here: a text stdin would raise the codec's error (or, under
    # a C locale, smuggle the bytes in as surrogates) instead of one clear line
    return decode_secret_value(name, sys.stdin.buffer.read())


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"secret store: {exc.strerror}{where}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
