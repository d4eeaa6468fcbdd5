"""The SecretStore contract, on the in-memory fake and on the filesystem store."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.adapters.fs.secrets import FileSecretStore
from relay.application.ports import SecretStore
from relay.domain.errors import InvalidNameError
from relay.domain.execution import SecretNotFound
from tests.fakes import InMemorySecretStore


@pytest.fixture(params=["memory", "fs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> SecretStore:
    if request.param == "memory":
        return InMemorySecretStore()
    return FileSecretStore(tmp_path / "state" / "secrets")  # not created yet, as on a new host


def test_an_empty_store_has_no_names_and_no_values(store: SecretStore) -> None:
    assert store.names() == []
    with pytest.raises(SecretNotFound, match=r'^secret "db-url" is not set$'):
        store.get("db-url")


def test_set_then_get_returns_the_value_and_set_again_replaces_it(store: SecretStore) -> None:
    store.set("db-url", "postgres://a")
    assert store.get("db-url") == "postgres://a"
    store.set("db-url", "postgres://b")
    assert store.get("db-url") == "postgres://b"
    assert store.names() == ["db-url"]


def test_an_empty_value_and_unicode_text_are_values(store: SecretStore) -> None:
    store.set("empty", "")
    store.set("greeting", "grüße\nzeile 2")
    assert (store.get("empty"), store.get("greeting")) == ("", "grüße\nzeile 2")


def test_names_are_sorted(store: SecretStore) -> None:
    for name in ("zeta", "alpha", "mid.dle", "_under"):
        store.set(name, "v")
    assert store.names() == sorted(["zeta", "alpha", "mid.dle", "_under"])


def test_remove_deletes_and_an_unknown_name_is_not_found(store: SecretStore) -> None:
    store.set("token", "t")
    store.set("other", "o")
    store.remove("token")
    assert store.names() == ["other"]
    with pytest.raises(SecretNotFound, match=r'^secret "token" is not set$'):
        store.get("token")
    with pytest.raises(SecretNotFound, match=r'^secret "token" is not set$'):
        store.remove("token")


@pytest.mark.parametrize("name", ["UPPER", ".hidden", "a/b", "", "x" * 64])
def test_an_invalid_name_is_refused_without_showing_it(store: SecretStore, name: str) -> None:
    for call in (lambda: store.get(name), lambda: store.set(name, "v"),
                 lambda: store.remove(name)):
        with pytest.raises(InvalidNameError) as raised:
            call()
        assert "not shown" in str(raised.value)
        assert name == "" or name not in str(raised.value)
    assert store.names() == []
