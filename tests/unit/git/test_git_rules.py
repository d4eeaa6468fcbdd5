"""The git sync rules in the domain: accepted URLs, refs and paths, the webhook's
push filter and the signature check. Table tests, no I/O."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from relay.domain.git import (
    GitError,
    GitSource,
    make_source,
    parse_ssh_url,
    push_decision,
    ref_candidates,
    signature_valid,
    validate_path,
    validate_ref,
)

ACCEPTED = [
    ("git@github.com:acme/repo.git", "github.com", None, "acme/repo"),
    ("git@gitlab.example.com:group/sub/repo", "gitlab.example.com", None, "group/sub/repo"),
    ("ssh://git@github.com/acme/repo.git", "github.com", None, "acme/repo"),
    ("ssh://git@127.0.0.1:2222/srv/git/repo.git", "127.0.0.1", 2222, "srv/git/repo"),
    ("ssh://git@[::1]:2222/repo.git", "::1", 2222, "repo"),
    ("deploy@host:/srv/repo.git", "host", None, "srv/repo"),
]


@pytest.mark.parametrize(("url", "host", "port", "path"), ACCEPTED)
def test_ssh_urls_in_both_forms_are_accepted(
    url: str, host: str, port: int | None, path: str
) -> None:
    parsed = parse_ssh_url(url)
    assert parsed.host == host
    assert parsed.port == port
    assert parsed.identity() == (host.lower(), path)


REFUSED = [
    ("https://github.com/acme/repo.git", "only SSH is supported"),
    ("http://github.com/acme/repo.git", "only SSH is supported"),
    ("file:///srv/repo.git", "only SSH is supported"),
    ("git://github.com/acme/repo.git", "only SSH is supported"),
    ("ext::sh -c touch% /tmp/pwned", "whitespace"),
    ("ext::ssh%20host", "transport helper"),
    ("-oProxyCommand=touch /tmp/x", "whitespace"),
    ("-oProxyCommand=x:y", "starts with '-'"),
    ("ssh://-oProxyCommand=x/repo", "not an SSH URL"),
    ("git@host:-upload-pack=x", "not an SSH URL"),
    ("git@host:org/repo\n", "control characters"),
    ("git@host:org/\x1brepo", "control characters"),
    ("/srv/repo.git", "not an SSH URL"),
    ("./repo", "not an SSH URL"),
    ("", "empty"),
    ("ssh://git@host:99999/repo.git", "invalid port"),
]


@pytest.mark.parametrize(("url", "why"), REFUSED)
def test_anything_but_ssh_is_refused_with_one_line(url: str, why: str) -> None:
    with pytest.raises(GitError) as caught:
        parse_ssh_url(url)
    message = str(caught.value)
    assert why in message
    assert "\n" not in message
    assert "\x1b" not in message  # echoed escaped, never raw


@pytest.mark.parametrize("ref", ["main", "release/1.x", "v1.2.3", "refs/heads/main",
                                 "0123abcd" * 5])
def test_branch_tag_and_commit_refs_are_accepted(ref: str) -> None:
    assert validate_ref(ref) == ref


@pytest.mark.parametrize("ref", ["", "-x", "--upload-pack=x", "a..b", "main/", "a b",
                                 "x.lock", "/main", "a@{1}", "a:b", "a\nb"])
def test_refs_that_could_be_options_or_are_not_ref_names_are_refused(ref: str) -> None:
    with pytest.raises(GitError, match="is not a branch, tag or commit name"):
        validate_ref(ref)


def test_paths_are_relative_directories_normalised() -> None:
    assert validate_path("functions") == "functions"
    assert validate_path("./services/fns/") == "services/fns"
    for bad in ("/etc", "..", "a/../../b", "", ".", "-x", "a b"):
        with pytest.raises(GitError):
            validate_path(bad)


def test_ref_candidates_try_branch_then_tag_then_commit() -> None:
    assert ref_candidates("main") == ["refs/remotes/origin/main", "refs/tags/main"]
    assert ref_candidates("abc1234")[-1] == "abc1234"
    assert ref_candidates("refs/heads/dev") == ["refs/remotes/origin/dev"]
    assert ref_candidates("refs/tags/v1") == ["refs/tags/v1"]


def test_make_source_validates_every_field() -> None:
    source = make_source("git@github.com:acme/repo.git", ref="v1", path="fns/")
    assert source == GitSource(repository="git@github.com:acme/repo.git", ref="v1", path="fns")
    with pytest.raises(GitError):
        make_source("git@github.com:acme/repo.git", ref="--output=/etc/x")


SOURCE = GitSource(repository="git@github.com:Acme/Repo.git", ref="main")


def push(**overrides: object) -> dict[str, object]:
    payload: dict[str, object] = {
        "ref": "refs/heads/main",
        "deleted": False,
        "repository": {
            "full_name": "acme/repo",
            "ssh_url": "git@github.com:acme/repo.git",
            "clone_url": "https://github.com/acme/repo.git",
        },
    }
    payload.update(overrides)
    return payload


@pytest.mark.parametrize(
    ("event", "payload", "schedule", "reason"),
    [
        ("push", push(), True, "push accepted"),
        ("ping", {"zen": "x"}, False, "ping"),
        ("issues", push(), False, "event issues ignored"),
        (None, push(), False, "event (none) ignored"),
        ("push", push(ref="refs/heads/dev"), False, "other ref ignored"),
        ("push", push(ref="refs/tags/main"), True, "push accepted"),
        ("push", push(deleted=True), False, "deleted ref ignored"),
        ("push", push(repository={"ssh_url": "git@github.com:acme/other.git"}), False,
         "other repository ignored"),
        ("push", push(repository={"ssh_url": "git@gitlab.com:acme/repo.git"}), False,
         "other repository ignored"),
        ("push", push(repository={"clone_url": "https://github.com/ACME/repo"}), True,
         "push accepted"),
        ("push", push(repository="acme/repo"), False, "other repository ignored"),
        ("push", [1, 2], False, "payload is not an object"),
    ],
)
def test_only_pushes_to_the_configured_repository_and_ref_schedule_a_sync(
    event: str | None, payload: object, schedule: bool, reason: str
) -> None:
    decision = push_decision(event, payload, SOURCE)
    assert (decision.schedule, decision.reason) == (schedule, reason)


def test_a_full_ref_name_matches_only_itself() -> None:
    source = GitSource(repository=SOURCE.repository, ref="refs/tags/v1")
    assert push_decision("push", push(ref="refs/tags/v1"), source).schedule
    assert not push_decision("push", push(ref="refs/heads/v1"), source).schedule


def test_the_signature_is_the_hmac_of_the_raw_body() -> None:
    body = b'{"ref":"refs/heads/main"}'
    good = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert signature_valid("s3cret", body, good)
    assert not signature_valid("s3cret", body + b" ", good)
    assert not signature_valid("other", body, good)
    assert not signature_valid("s3cret", body, None)
    assert not signature_valid("s3cret", body, "")
    assert not signature_valid("s3cret", body, good.replace("sha256=", "sha1="))
    assert not signature_valid("s3cret", body, "sha256=zz")


def test_a_non_ascii_signature_or_a_blank_secret_is_simply_invalid() -> None:
    body = b'{"ref": "refs/heads/main"}'
    good = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert not signature_valid("s3cret", body, good[:-1] + "\u00e9")  # no TypeError
    assert not signature_valid("s3cret", body, "sha256=\udce9" + good[8:])
    for blank in ("", " ", "\n", "\t\r\n"):
        signed_with_it = "sha256=" + hmac.new(blank.encode(), body, hashlib.sha256).hexdigest()
        assert not signature_valid(blank, body, signed_with_it)
