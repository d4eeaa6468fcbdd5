"""FileSecretStore on temporary directories: modes, atomic writes, symlinks, names."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relay.adapters.fs.secrets import FileSecretStore, SecretStoreError
from relay.domain.errors import InvalidNameError
from relay.domain.execution import SecretNotFound
from relay.entrypoints.cli import app


@pytest.fixture
def store(tmp_path: Path) -> FileSecretStore:
    return FileSecretStore(tmp_path / "state" / "secrets")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_set_creates_0700_directory_and_0600_file(store: FileSecretStore) -> None:
    old = os.umask(0)
    try:
        store.set("db-url", "postgres://u:p@h/db")
    finally:
        os.umask(old)
    assert mode(store.directory) == 0o700
    assert mode(store.directory / "db-url") == 0o600
    assert store.get("db-url") == "postgres://u:p@h/db"


def test_values_round_trip_verbatim(store: FileSecretStore) -> None:
    value = "line one\nline two\n  spaced  \u00e9"
    store.set("multi", value)
    assert store.get("multi") == value
    store.set("empty", "")
    assert store.get("empty") == ""


def test_overwrite_is_atomic_and_leaves_no_temporary_files(store: FileSecretStore) -> None:
    store.set("k", "v1")
    inode_before = os.lstat(store.directory / "k").st_ino
    store.set("k", "v2")
    assert store.get("k") == "v2"
    # replaced by rename, not rewritten in place
    assert os.lstat(store.directory / "k").st_ino != inode_before
    assert sorted(os.listdir(store.directory)) == ["k"]


def test_names_sorted_and_ignores_strays(store: FileSecretStore) -> None:
    assert store.names() == []
    store.set("b", "1")
    store.set("a.b", "2")
    (store.directory / ".tmp-leftover").write_text("x")
    (store.directory / "UPPER").write_text("x")
    os.mkdir(store.directory / "subdir")
    os.symlink(store.directory / "b", store.directory / "link")
    assert store.names() == ["a.b", "b"]


def test_get_refuses_a_symlink(store: FileSecretStore, tmp_path: Path) -> None:
    store.set("real", "x")
    target = tmp_path / "outside"
    target.write_text("not a secret")
    os.symlink(target, store.directory / "planted")
    with pytest.raises(SecretStoreError):
        store.get("planted")


def test_set_replaces_a_symlink_instead_of_writing_through_it(
    store: FileSecretStore, tmp_path: Path
) -> None:
    store.set("real", "x")
    target = tmp_path / "victim"
    target.write_text("original")
    os.symlink(target, store.directory / "k")
    store.set("k", "new")
    assert target.read_text() == "original"
    assert not os.path.islink(store.directory / "k")
    assert store.get("k") == "new"


def test_a_symlinked_store_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.symlink(real, tmp_path / "secrets")
    store = FileSecretStore(tmp_path / "secrets")
    with pytest.raises(SecretStoreError):
        store.set("k", "v")


def test_missing_secret(store: FileSecretStore) -> None:
    with pytest.raises(SecretNotFound):
        store.get("nope")
    store.set("other", "x")
    with pytest.raises(SecretNotFound):
        store.get("nope")
    with pytest.raises(SecretNotFound):
        store.remove("nope")


def test_remove(store: FileSecretStore) -> None:
    store.set("k", "v")
    store.remove("k")
    assert store.names() == []
    with pytest.raises(SecretNotFound):
        store.get("k")


@pytest.mark.parametrize(
    "name",
    ["", "Upper", ".hidden", "trailing.", "a/b", "../x", "a b", "x" * 64, "é"],
)
def test_invalid_names_are_refused_before_touching_the_path(
    store: FileSecretStore, name: str
) -> None:
    for call in (lambda: store.set(name, "v"), lambda: store.get(name), lambda: store.remove(name)):
        with pytest.raises(InvalidNameError):
            call()
    assert not store.directory.exists()


@pytest.mark.parametrize("name", ["a", "db-url", "api_key", "v1.2", "x" * 63, "-a", "a-"])
def test_valid_names(store: FileSecretStore, name: str) -> None:
    store.set(name, "v")
    assert store.get(name) == "v"


def test_cli_set_ls_rm_never_prints_the_value(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"RELAY_STATE_DIR": str(tmp_path)}
    result = runner.invoke(app, ["secret", "set", "api-key"], input="canary-7f3a", env=env)
    assert result.exit_code == 0, result.output
    assert "canary-7f3a" not in result.output
    assert FileSecretStore(tmp_path / "secrets").get("api-key") == "canary-7f3a"
    listed = runner.invoke(app, ["secret", "ls"], env=env)
    assert listed.exit_code == 0
    assert listed.output.splitlines() == ["NAME", "api-key"]
    assert runner.invoke(app, ["secret", "rm", "api-key"], env=env).exit_code == 0
    missing = runner.invoke(app, ["secret", "rm", "api-key"], env=env)
    assert missing.exit_code == 1
    bad = runner.invoke(app, ["secret", "set", "Bad/Name"], input="x", env=env)
    assert bad.exit_code == 1
    assert "Traceback" not in bad.output


NOT_UTF8 = b"\xff\xfe" + b"canary-90ab" + b"\x80"


def test_a_file_that_is_not_utf8_is_refused_naming_the_secret_only(
    store: FileSecretStore,
) -> None:
    store.set("api-key", "x")
    (store.directory / "api-key").write_bytes(NOT_UTF8)
    with pytest.raises(SecretStoreError) as caught:
        store.get("api-key")
    message = str(caught.value)
    assert message.startswith('secret "api-key" is not valid UTF-8 text')
    assert "canary-90ab" not in message
    assert "\\x" not in message
    assert "\n" not in message
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("\udcffcanary-90ab", "is not valid UTF-8 text"),  # a surrogateescape'd byte
        ("canary-90ab\x00rest", "contains a NUL byte"),
    ],
)
def test_set_refuses_what_an_environment_variable_cannot_hold(
    store: FileSecretStore, value: str, problem: str
) -> None:
    with pytest.raises(SecretStoreError) as caught:
        store.set("api-key", value)
    assert f'secret "api-key" {problem}' in str(caught.value)
    assert "canary-90ab" not in str(caught.value)
    assert not store.directory.exists() or store.names() == []


def test_a_stored_nul_byte_is_refused_on_read(store: FileSecretStore) -> None:
    store.set("api-key", "x")
    (store.directory / "api-key").write_bytes(b"canary-90ab\x00")
    with pytest.raises(SecretStoreError, match='secret "api-key" contains a NUL byte'):
        store.get("api-key")


def test_cli_set_refuses_bytes_that_are_not_utf8_and_keeps_the_old_value(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    env = {"RELAY_STATE_DIR": str(tmp_path)}
    assert runner.invoke(app, ["secret", "set", "api-key"], input="old", env=env).exit_code == 0
    result = runner.invoke(app, ["secret", "set", "api-key"], input=NOT_UTF8, env=env)
    assert result.exit_code == 1
    [line] = result.output.splitlines()
    assert 'secret "api-key" is not valid UTF-8 text' in line
    assert "canary-90ab" not in result.output
    assert "Traceback" not in result.output
    assert FileSecretStore(tmp_path / "secrets").get("api-key") == "old"


@pytest.mark.parametrize("given", ["", b""])
def test_cli_set_refuses_an_empty_value_unless_allowed(tmp_path: Path, given: str | bytes) -> None:
    """An empty pipe (or a bare Enter at the prompt) would blank a working secret."""
    runner = CliRunner()
    env = {"RELAY_STATE_DIR": str(tmp_path)}
    store = FileSecretStore(tmp_path / "secrets")
    assert runner.invoke(app, ["secret", "set", "api-key"], input="old", env=env).exit_code == 0
    refused = runner.invoke(app, ["secret", "set", "api-key"], input=given, env=env)
    assert refused.exit_code == 1
    assert refused.stderr == (
        'relay: secret "api-key": the value is empty; nothing changed '
        "(pass --allow-empty to store an empty value)\n"
    )
    assert store.get("api-key") == "old"
    allowed = runner.invoke(
        app, ["secret", "set", "api-key", "--allow-empty"], input=given, env=env
    )
    assert allowed.exit_code == 0, allowed.output
    assert store.get("api-key") == ""


@pytest.mark.parametrize("given", ["\n", "\r\n", "  \t\n", b"\n\n"])
def test_cli_set_refuses_a_whitespace_only_value_unless_allowed(
    tmp_path: Path, given: str | bytes
) -> None:
    """`echo $UNSET | relay secret set github-webhook` pipes a bare newline: as a
    webhook secret that is an empty HMAC key anyone can sign with."""
    runner = CliRunner()
    env = {"RELAY_STATE_DIR": str(tmp_path)}
    store = FileSecretStore(tmp_path / "secrets")
    assert runner.invoke(app, ["secret", "set", "hook"], input="old", env=env).exit_code == 0
    refused = runner.invoke(app, ["secret", "set", "hook"], input=given, env=env)
    assert refused.exit_code == 1
    assert refused.stderr == (
        'relay: secret "hook": the value is only whitespace; nothing changed '
        "(pass --allow-empty to store an empty value)\n"
    )
    assert store.get("hook") == "old"
    allowed = runner.invoke(app, ["secret", "set", "hook", "--allow-empty"], input=given, env=env)
    assert allowed.exit_code == 0, allowed.output


def test_cli_set_allow_empty_is_a_flag_and_a_bad_name_is_refused_before_reading(
    tmp_path: Path,
) -> None:
    runner = CliRunner()
    env = {"RELAY_STATE_DIR": str(tmp_path)}
    valued = runner.invoke(app, ["secret", "set", "k", "--allow-empty=yes"], input="v", env=env)
    assert valued.exit_code == 2
    assert "does not take a value" in valued.stderr
    bad = runner.invoke(app, ["secret", "set", "Bad/Name"], input="", env=env)
    assert bad.exit_code == 1
    assert bad.stderr.startswith("relay: invalid secret name (8 characters, not shown)")
    assert not (tmp_path / "secrets").exists()


CREDENTIAL = "postgres://admin:hunter2-s3cr3t@db.internal/app"


@pytest.mark.parametrize(
    "args",
    [["secret", "set", CREDENTIAL], ["secret", "rm", CREDENTIAL],
     ["git", "set", "git@example.com:o/r.git", "--webhook-secret", CREDENTIAL]],
    ids=["secret set", "secret rm", "git set --webhook-secret"],
)
def test_a_credential_pasted_as_a_secret_name_is_never_echoed(
    tmp_path: Path, args: list[str]
) -> None:
    """Row 232: the error says what is wrong with the name and its length, never the
    name (issue 35 item 13: it echoed ``postgres://admin:...``)."""
    env = {"RELAY_STATE_DIR": str(tmp_path)}
    done = CliRunner().invoke(app, args, input="", env=env)
    assert done.exit_code == 1
    [line] = done.stderr.splitlines()
    assert line == (
        f"relay: invalid secret name ({len(CREDENTIAL)} characters, not shown):"
        " may contain only lowercase letters, digits, '.', '_' and '-'"
    )
    for part in ("hunter2", "s3cr3t", "admin", "postgres", "db.internal"):
        assert part not in done.output


@pytest.mark.parametrize("kind", ["missing", "a file"])
@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["table", "json"])
def test_secret_ls_of_an_unusable_state_dir_fails_in_one_line(
    tmp_path: Path, kind: str, json_flag: list[str]
) -> None:
    """Row 233: a wrong RELAY_STATE_DIR is an error (exit 1), not an empty table."""
    state = tmp_path / "state"
    if kind == "a file":
        state.write_text("")
    done = CliRunner().invoke(app, ["secret", "ls", *json_flag],
                              env={"RELAY_STATE_DIR": str(state)})  # fmt: skip
    assert done.exit_code == 1
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    reason = "does not exist" if kind == "missing" else "is not a directory"
    assert line == f"relay: state directory {state} {reason} (RELAY_STATE_DIR names it)"


def test_secret_ls_of_a_state_dir_without_secrets_is_an_empty_answer(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["secret", "ls"], env={"RELAY_STATE_DIR": str(tmp_path)})
    assert done.exit_code == 0, done.stderr
    assert done.stdout == "NAME\n"
