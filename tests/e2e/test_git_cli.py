"""``relay git ...`` as an operator runs it, against a real sshd and git-shell on
loopback (tests/gitbed.py): keys, sources, TOFU, refs, --path, repository
changes, removal, and every refusal. No worker runs here; see test_git_e2e.py."""

from __future__ import annotations

import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relay.adapters.fs.secrets import FileSecretStore
from relay.entrypoints.cli import app
from tests.e2e.harness import run_relay
from tests.gitbed import BareRepo, GitServer
from tests.json_schemas import assert_matches_schema

pytestmark = pytest.mark.git

TEMPLATE = "runtime: python3.14\nevents:\n  - handler: main.handler\n    pattern:\n      k: [v]\n"


@dataclass
class Operator:
    """An operator's shell: Relay's state directory and a functions directory."""

    env: dict[str, str]
    state: Path
    functions: Path
    server: GitServer

    def relay(self, *args: str, real: bool = False) -> tuple[int, str, str]:
        """Run ``relay ARGS``: the installed command in a process of its own when
        ``real``, else the same typer app in this process (an interpreter start per
        command would make these tests take minutes)."""
        if real:
            done = run_relay(list(args), self.env)
            return done.returncode, done.stdout, done.stderr
        result = CliRunner().invoke(app, list(args), env=self.env)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return result.exit_code, result.stdout, result.stderr

    def sync(self, *, real: bool = False) -> tuple[int, str, str]:
        return self.relay("git", "sync", "--functions", str(self.functions), real=real)

    def served(self) -> dict[str, str]:
        found = {}
        for path in sorted(self.functions.rglob("*")):
            if path.is_file():
                found[str(path.relative_to(self.functions))] = path.read_text()
        return found


@pytest.fixture
def operator(tmp_path: Path, git_server: GitServer) -> Operator:
    state = tmp_path / "state"
    functions = tmp_path / "functions"
    functions.mkdir()
    op = Operator({"RELAY_STATE_DIR": str(state)}, state, functions, git_server)
    code, out, err = op.relay("git", "keygen")
    assert code == 0, err
    git_server.authorize(out.strip().splitlines()[-1])
    return op


@pytest.fixture
def repo(operator: Operator) -> BareRepo:
    repo = operator.server.repo()
    repo.commit({"hello/template.yaml": TEMPLATE, "hello/main.py": "v1", "README.md": "x"})
    code, _, err = operator.relay("git", "set", repo.url)
    assert code == 0, err
    return repo


# --- keygen --------------------------------------------------------------------------
def test_keygen_writes_a_private_key_0600_in_a_0700_dir_and_refuses_to_overwrite(
    operator: Operator,
) -> None:
    key = operator.state / "ssh" / "id_ed25519"
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    before = key.read_bytes()
    code, out, err = operator.relay("git", "keygen", real=True)
    assert code == 1
    assert out == ""
    assert err.strip() == (f"relay: a deploy key already exists at {key}; use --force to "
                           "replace it (the old public key stops working)")
    assert key.read_bytes() == before
    code, out, err = operator.relay("git", "keygen", "--force")
    assert code == 0, err
    assert key.read_bytes() != before
    assert "PRIVATE" not in out
    assert out.strip().splitlines()[-1].startswith("ssh-ed25519 ")


# --- set -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://github.com/acme/repo.git", "uses https://: only SSH is supported"),
        ("file:///srv/repo.git", "uses file://: only SSH is supported"),
        ("ext::sh -c id", "contains whitespace or control characters"),
        ("ext::ssh", "names a git transport helper"),
        ("-oProxyCommand=id", "starts with '-'"),
        ("git@host:org/repo\tx", "contains whitespace or control characters"),
    ],
)
def test_set_refuses_anything_but_ssh_with_one_line_and_stores_nothing(
    operator: Operator, url: str, why: str
) -> None:
    code, out, err = operator.relay("git", "set", "--", url, real=url.startswith("https"))
    assert code == 1
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert why in err
    assert "Traceback" not in err
    assert not (operator.state / "git" / "source.json").exists()


def test_set_stores_the_source_0600_and_a_second_set_overwrites(operator: Operator) -> None:
    code, out, err = operator.relay("git", "set", "git@github.com:acme/a.git", "--ref", "v1",
                                    "--path", "fns/", "--webhook-secret", "hook")
    assert code == 0, err
    assert "Git source set: git@github.com:acme/a.git (ref v1, path fns)" in out
    assert "secret 'hook' is not set yet" in out
    source = operator.state / "git" / "source.json"
    assert stat.S_IMODE(source.stat().st_mode) == 0o600
    code, _, err = operator.relay("git", "set", "ssh://git@example.com:2222/b.git")
    assert code == 0, err
    code, out, _ = operator.relay("git", "status")
    assert "ssh://git@example.com:2222/b.git" in out
    assert "Ref:            main" in out
    assert "acme/a" not in out


def test_set_refuses_a_ref_or_path_that_could_be_an_option(operator: Operator) -> None:
    for extra in (["--ref", "--upload-pack=id"], ["--ref", "a..b"], ["--path", "../etc"]):
        code, _, err = operator.relay("git", "set", "git@github.com:a/b.git", *extra)
        assert code == 1, extra
        assert len(err.strip().splitlines()) == 1
    code, _, err = operator.relay("git", "set", "git@github.com:a/b.git",
                                  "--webhook-secret", "Bad Name")
    assert code == 1
    assert "invalid secret name" in err


def test_set_refuses_a_webhook_secret_whose_stored_value_is_blank(operator: Operator) -> None:
    secrets = operator.state / "secrets"
    FileSecretStore(secrets).set("hook", "\n")  # as `--allow-empty` or an older relay stored it
    code, out, err = operator.relay("git", "set", "git@github.com:a/b.git",
                                    "--webhook-secret", "hook")
    assert (code, out) == (1, "")
    assert err == ('relay: secret "hook" is empty or only whitespace: a webhook signed with '
                   "it proves nothing; set a random value with `relay secret set hook` first\n")
    assert not (operator.state / "git" / "source.json").exists()
    FileSecretStore(secrets).set("hook", "r4ndom")
    code, out, err = operator.relay("git", "set", "git@github.com:a/b.git",
                                    "--webhook-secret", "hook")
    assert code == 0, err
    assert "not set yet" not in out


def test_a_corrupt_source_json_is_one_line_for_every_reader_and_set_replaces_it(
    operator: Operator,
) -> None:
    (operator.state / "git").mkdir(mode=0o700)
    (operator.state / "git" / "source.json").write_text('{"repository": "https://x/y"')
    for command in (["git", "status"], ["git", "sync", "--functions", str(operator.functions)],
                    ["git", "remove"]):
        code, out, err = operator.relay(*command)
        assert code == 1, command
        assert out == ""
        assert "source.json is corrupt" in err
        assert "run `relay git set <repository>` again" in err
        assert len(err.strip().splitlines()) == 1
    # a hand edit that smuggles an option is just as corrupt
    (operator.state / "git" / "source.json").write_text(
        '{"repository": "git@h:a/b.git", "ref": "--upload-pack=id"}'
    )
    code, _, err = operator.relay("git", "status")
    assert code == 1
    assert "corrupt" in err
    code, _, err = operator.relay("git", "set", "git@github.com:a/b.git")
    assert code == 0, err
    assert operator.relay("git", "status")[0] == 0


# --- sync --------------------------------------------------------------------------------
def test_first_sync_trusts_the_host_then_verifies_it_and_a_changed_key_is_refused(
    operator: Operator, repo: BareRepo
) -> None:
    server = operator.server
    code, out, err = operator.sync(real=True)
    assert code == 0, err
    assert (f"Trusted new host {server.host_label} (fingerprint {server.host_fingerprint()})"
            in out.splitlines())
    known_hosts = operator.state / "ssh" / "known_hosts"
    assert stat.S_IMODE(known_hosts.stat().st_mode) == 0o600
    pinned = known_hosts.read_text()
    assert operator.served() == {"hello/template.yaml": TEMPLATE, "hello/main.py": "v1"}

    code, out, err = operator.sync()  # the pinned key now verifies: no second "Trusted"
    assert code == 0, err
    assert "Trusted" not in out

    server.stop()
    server.start(new_host_key=True)  # same address, another key: a man in the middle
    repo.commit({"hello/main.py": "v2-from-the-impostor"})
    code, out, err = operator.sync(real=True)
    assert code == 1
    assert "WARNING: the SSH host key of" in err
    assert "man-in-the-middle" in err
    assert f"it now presents {server.host_fingerprint()}" in err
    assert len(err.strip().splitlines()) == 1
    assert known_hosts.read_text() == pinned  # never replaced
    assert operator.served()["hello/main.py"] == "v1"  # the last good state
    code, out, _ = operator.relay("git", "status")
    assert "failed: WARNING: the SSH host key" in out


def test_the_operators_own_known_hosts_and_ssh_config_are_never_read(
    operator: Operator, repo: BareRepo, tmp_path: Path
) -> None:
    # ssh reads the user's files from the passwd home, which a test must not touch;
    # so an `ssh` first on PATH records exactly what git ran it with, then runs it
    wrapper = tmp_path / "bin" / "ssh"
    wrapper.parent.mkdir()
    argv_log = tmp_path / "ssh-argv"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {argv_log}\nexec /usr/bin/ssh "$@"\n')
    wrapper.chmod(0o755)
    operator.env["PATH"] = f"{wrapper.parent}:{os.environ['PATH']}"
    code, out, err = operator.sync(real=True)
    assert code == 0, err
    assert "Trusted new host" in out
    argv = argv_log.read_text().splitlines()
    known_hosts = operator.state / "ssh" / "known_hosts"
    assert argv[argv.index("-F") + 1] == "/dev/null"  # no ~/.ssh/config, no system config
    assert argv[argv.index("-i") + 1] == str(operator.state / "ssh" / "id_ed25519")
    for option in ("StrictHostKeyChecking=accept-new", f"UserKnownHostsFile={known_hosts}",
                   "GlobalKnownHostsFile=/dev/null", "IdentitiesOnly=yes", "BatchMode=yes"):
        assert option in argv
    options = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"]
    assert [o for o in options if o.startswith("StrictHostKeyChecking")] == [
        "StrictHostKeyChecking=accept-new"
    ]


def test_branch_tag_and_commit_refs_check_out_detached(
    operator: Operator, repo: BareRepo
) -> None:
    first = repo.commit({"hello/main.py": "v1"})
    repo.tag("v1")
    repo.commit({"hello/main.py": "v2"})
    repo.commit({"hello/main.py": "dev"}, branch="dev")
    for ref, expected, commit in (("main", "v2", None), ("v1", "v1", first),
                                  ("dev", "dev", None), (first, "v1", first)):
        code, _, err = operator.relay("git", "set", repo.url, "--ref", ref)
        assert code == 0, err
        code, out, err = operator.sync()
        assert code == 0, (ref, err)
        assert operator.served()["hello/main.py"] == expected, ref
        if commit is not None:
            assert f"at {commit[:12]}" in out
    head = (operator.state / "git" / "checkout" / ".git" / "HEAD").read_text().strip()
    assert head == first  # detached: HEAD is a commit id, not a branch
    code, _, err = operator.relay("git", "set", repo.url, "--ref", "no-such-branch")
    assert code == 0
    code, _, err = operator.sync()
    assert code == 1
    assert "ref 'no-such-branch' is not a branch, tag or commit of" in err
    assert operator.served()["hello/main.py"] == "v1"


def test_sync_replaces_exactly_removes_what_left_and_an_empty_source_empties(
    operator: Operator, repo: BareRepo
) -> None:
    (operator.functions / "by-hand").mkdir()
    (operator.functions / "by-hand" / "template.yaml").write_text(TEMPLATE)
    repo.commit({"second/template.yaml": TEMPLATE, "second/main.py": "s"})
    code, out, err = operator.sync()
    assert code == 0, err
    assert sorted(p.name for p in operator.functions.iterdir()) == ["hello", "second"]
    assert "removed: by-hand" in out
    assert err == "relay: note: no worker is running: synced in this process\n"
    repo.commit({}, remove=("hello",))
    code, out, err = operator.sync()
    assert code == 0, err
    assert sorted(p.name for p in operator.functions.iterdir()) == ["second"]
    repo.commit({"docs/x.md": "no functions here"}, remove=("second",))
    code, out, err = operator.sync()
    assert code == 0, err
    assert "0 function(s)" in out
    assert list(operator.functions.iterdir()) == []


def test_path_selects_a_monorepo_directory_and_a_missing_path_changes_nothing(
    operator: Operator, repo: BareRepo
) -> None:
    repo.commit({"services/fns/api/template.yaml": TEMPLATE, "services/fns/api/main.py": "a"})
    code, _, err = operator.relay("git", "set", repo.url, "--path", "services/fns")
    assert code == 0, err
    code, _, err = operator.sync()
    assert code == 0, err
    assert sorted(p.name for p in operator.functions.iterdir()) == ["api"]
    code, _, err = operator.relay("git", "set", repo.url, "--path", "nowhere")
    assert code == 0, err
    code, _, err = operator.sync()
    assert code == 1
    assert "path 'nowhere' is not a directory in main" in err
    assert sorted(p.name for p in operator.functions.iterdir()) == ["api"]


def test_a_changed_repository_is_cloned_afresh(operator: Operator, repo: BareRepo) -> None:
    assert operator.sync()[0] == 0
    other = operator.server.repo("other")
    other.commit({"elsewhere/template.yaml": TEMPLATE})
    code, _, err = operator.relay("git", "set", other.url)
    assert code == 0, err
    code, _, err = operator.sync()
    assert code == 0, err
    assert sorted(p.name for p in operator.functions.iterdir()) == ["elsewhere"]
    checkout = operator.state / "git" / "checkout"
    assert not (checkout / "hello").exists()
    assert not (checkout / "README.md").exists()


def test_an_unreachable_remote_fails_in_one_line_and_keeps_the_functions(
    operator: Operator, repo: BareRepo
) -> None:
    assert operator.sync()[0] == 0
    operator.server.stop()
    code, _, err = operator.sync()
    assert code == 1
    assert err.strip() == (f"relay: cannot reach {operator.server.host_label}: connect to host "
                           f"127.0.0.1 port {operator.server.port}: Connection refused")
    assert operator.served()["hello/main.py"] == "v1"


def test_a_sync_during_a_sync_is_refused_and_changes_nothing(
    operator: Operator, repo: BareRepo
) -> None:
    assert operator.sync()[0] == 0
    repo.commit({"hello/main.py": "v2"})
    lock = operator.state / "git" / "sync.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a running sync (CLI or webhook) holds
        code, _, err = operator.sync()
    finally:
        os.close(fd)
    assert code == 1
    assert "another git sync is running" in err
    assert operator.served()["hello/main.py"] == "v1"
    assert operator.sync()[0] == 0
    assert operator.served()["hello/main.py"] == "v2"


def test_a_key_the_server_does_not_know_is_named_as_the_problem(
    operator: Operator, repo: BareRepo
) -> None:
    code, _, err = operator.relay("git", "keygen", "--force")  # not registered with the server
    assert code == 0, err
    code, _, err = operator.sync()
    assert code == 1
    assert err.strip() == (f"relay: {operator.server.host_label} refused the deploy key: add the "
                           "public key (`relay git keygen` printed it) as a read-only deploy key "
                           "of the repository")
    assert operator.served() == {}


def test_remove_during_a_sync_is_refused_and_keeps_the_checkout(
    operator: Operator, repo: BareRepo
) -> None:
    assert operator.sync()[0] == 0
    fd = os.open(operator.state / "git" / "sync.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        code, _, err = operator.relay("git", "remove")
    finally:
        os.close(fd)
    assert code == 1
    assert "another git sync is running" in err
    assert (operator.state / "git" / "checkout" / ".git").is_dir()
    assert (operator.state / "git" / "source.json").is_file()


def test_sync_without_a_key_or_a_source_says_what_to_run(operator: Operator) -> None:
    code, _, err = operator.sync()
    assert code == 1
    assert "no git source configured: run `relay git set <repository>` first" in err
    (operator.state / "ssh" / "id_ed25519").unlink()
    operator.relay("git", "set", "git@github.com:a/b.git")
    code, _, err = operator.sync()
    assert code == 1
    assert "run `relay git keygen` first" in err


# --- status and remove ---------------------------------------------------------------
def test_status_shows_the_source_and_commit_but_never_key_material(
    operator: Operator, repo: BareRepo
) -> None:
    code, out, _ = operator.relay("git", "status")
    assert code == 0
    assert "Checkout:       none yet" in out
    assert "Last sync:      never" in out
    assert operator.sync()[0] == 0
    code, out, _ = operator.relay("git", "status")
    commit = (operator.state / "git" / "checkout" / ".git" / "HEAD").read_text().strip()
    assert f"Commit:         {commit}" in out
    assert "ok (1 function(s))" in out
    code, as_json, _ = operator.relay("git", "status", "--json")
    assert code == 0
    doc = assert_matches_schema(as_json)
    assert doc["checkout"] == {"present": True, "commit": commit}
    assert doc["last_sync"]["ok"] is True
    assert doc["last_sync"]["functions"] == ["hello"]
    assert doc["last_sync"]["commit"] == commit
    private = (operator.state / "ssh" / "id_ed25519").read_text()
    public = (operator.state / "ssh" / "id_ed25519.pub").read_text().split()[1]
    body = "".join(line for line in private.splitlines() if "-----" not in line)
    for secret_part in (body[:40], body[-40:], public):
        assert secret_part not in out
        assert secret_part not in as_json


def test_remove_keeps_key_and_functions_and_is_idempotent(
    operator: Operator, repo: BareRepo
) -> None:
    assert operator.sync()[0] == 0
    code, out, err = operator.relay("git", "remove")
    assert code == 0, err
    assert "the deploy key and the functions directory were kept" in out
    assert not (operator.state / "git" / "source.json").exists()
    assert not (operator.state / "git" / "checkout").exists()
    assert (operator.state / "ssh" / "id_ed25519").is_file()
    assert operator.served()["hello/main.py"] == "v1"
    code, out, _ = operator.relay("git", "remove")
    assert (code, out.strip()) == (0, "No git source configured.")
    code, out, _ = operator.relay("git", "status")
    assert (code, out.strip()) == (0, "No git source configured.")
