"""The local secret store: one file per secret under ``<state dir>/secrets``.

The directory is created with mode 0700; each value is written to a temporary
file (mode 0600) in the same directory, fsynced and renamed into place, so a
reader sees the old value or the new one, never a torn one. Symlinks are never
followed (``O_NOFOLLOW``), and names are validated before they touch the path.

A value is UTF-8 text without NUL bytes: it becomes an environment variable,
which can hold nothing else. Binary material must be encoded (base64, hex) by
whoever stores it. ``set`` refuses anything else, and ``get`` refuses a file
written past Relay that does not follow the rule; every error names the secret,
never its content (an exception of the codec would carry the bytes).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets as _random
import stat
from pathlib import Path

from relay.adapters.fs.private import private_directory
from relay.domain.errors import InvalidNameError, RelayError
from relay.domain.execution import SecretNotFound
from relay.domain.names import secret_name_error

_NAME = re.compile(r"[a-z0-9_-]([a-z0-9._-]{0,61}[a-z0-9_-])?")
_TMP_PREFIX = ".tmp-"


class SecretStoreError(RelayError):
    """The secret store's directory or a secret file is unusable."""


def decode_secret_value(name: str, data: bytes) -> str:
    """``data`` as a secret's text, or :class:`SecretStoreError` naming ``name`` only."""
    try:
        value = data.decode("utf-8")
    except UnicodeDecodeError:
        # from None: the codec's exception holds the bytes, and a chained
        # traceback would print them
        raise SecretStoreError(_not_text(name)) from None
    _check_no_nul(name, value)
    return value


def encode_secret_value(name: str, value: str) -> bytes:
    """``value`` as the bytes to store, or :class:`SecretStoreError` naming ``name`` only."""
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates, e.g. from a surrogateescape stdin
        raise SecretStoreError(_not_text(name)) from None
    _check_no_nul(name, value)
    return data


def _not_text(name: str) -> str:
    return (
        f'secret "{name}" is not valid UTF-8 text; a secret becomes an environment '
        "variable, so encode binary values (base64, hex) before storing them"
    )


def _check_no_nul(name: str, value: str) -> None:
    if "\x00" in value:
        raise SecretStoreError(
            f'secret "{name}" contains a NUL byte, which an environment variable cannot hold'
        )


def validate_secret_name(name: str) -> str:
    """Lowercase letters, digits, ``.``, ``_``, ``-``; no leading or trailing
    ``.``; at most 63 characters (the domain's rule; the error never shows the name)."""
    error = secret_name_error(name)
    if error is not None:
        raise InvalidNameError(error)
    return name


class FileSecretStore:
    """``SecretStore`` on the local filesystem."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def _check_directory(self, *, create: bool) -> bool:
        try:
            info = os.lstat(self.directory)
        except FileNotFoundError:
            if not create:
                return False
            private_directory(self.directory.parent)  # the state dir: 0700 when made here
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.directory, 0o700)
            info = os.lstat(self.directory)
        if not stat.S_ISDIR(info.st_mode):
            raise SecretStoreError(f"secret store {self.directory} is not a directory")
        if create and stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(self.directory, 0o700)
        return True

    def get(self, name: str) -> str:
        validate_secret_name(name)
        if not self._check_directory(create=False):
            raise SecretNotFound(f'secret "{name}" is not set')
        path = self.directory / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SecretNotFound(f'secret "{name}" is not set') from None
        except OSError as exc:  # ELOOP: a symlink planted in place of the secret
            raise SecretStoreError(f'secret "{name}" cannot be read: {exc.strerror}') from exc
        try:
            with os.fdopen(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    raise SecretStoreError(f'secret "{name}" is not a regular file')
                data = handle.read()
        except OSError as exc:
            raise SecretStoreError(f'secret "{name}" cannot be read: {exc.strerror}') from None
        return decode_secret_value(name, data)

    def names(self) -> list[str]:
        if not self._check_directory(create=False):
            return []
        found = []
        for entry in os.scandir(self.directory):
            if entry.name.startswith(_TMP_PREFIX) or not _NAME.fullmatch(entry.name):
                continue
            if entry.is_file(follow_symlinks=False):
                found.append(entry.name)
        return sorted(found)

    def set(self, name: str, value: str) -> None:
        validate_secret_name(name)
        data = encode_secret_value(name, value)
        self._check_directory(create=True)
        tmp = self.directory / f"{_TMP_PREFIX}{_random.token_hex(8)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600)
        try:
            os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask took away
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            # rename replaces a symlink at the target rather than writing through it
            os.replace(tmp, self.directory / name)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def remove(self, name: str) -> None:
        validate_secret_name(name)
        if not self._check_directory(create=False):
            raise SecretNotFound(f'secret "{name}" is not set')
        try:
            os.unlink(self.directory / name)
        except FileNotFoundError:
            raise SecretNotFound(f'secret "{name}" is not set') from None
