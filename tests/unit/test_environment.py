"""Per-invocation environment: literal env plus secrets resolved just in time."""

from __future__ import annotations

import pytest

from relay.application.environment import MissingSecret, resolve_environment
from relay.domain.errors import RelayError
from tests.fakes import InMemorySecretStore


def test_env_and_secrets_are_merged() -> None:
    store = InMemorySecretStore({"db-url": "postgres://s3cret"})
    env = resolve_environment(
        {"API_URL": "https://x", "FLAG": ""}, {"DATABASE_URL": "db-url"}, store
    )
    assert env == {"API_URL": "https://x", "FLAG": "", "DATABASE_URL": "postgres://s3cret"}


def test_secrets_are_read_on_every_resolution_so_rotation_is_seen() -> None:
    store = InMemorySecretStore({"key": "v1"})
    assert resolve_environment({}, {"KEY": "key"}, store)["KEY"] == "v1"
    store.set("key", "v2")
    assert resolve_environment({}, {"KEY": "key"}, store)["KEY"] == "v2"
    assert store.reads == ["key", "key"]


def test_missing_secret_names_the_reference_never_a_value() -> None:
    store = InMemorySecretStore({"other": "canary-value-123"})
    with pytest.raises(MissingSecret) as caught:
        resolve_environment({"A": "1"}, {"TOKEN": "api-token"}, store)
    assert isinstance(caught.value, RelayError)
    message = str(caught.value)
    assert "api-token" in message
    assert "TOKEN" in message
    assert "canary-value-123" not in message
    assert "\n" not in message


def test_relay_handler_is_reserved() -> None:
    store = InMemorySecretStore({"h": "evil"})
    env = resolve_environment({"RELAY_HANDLER": "x"}, {"RELAY_HANDLER": "h"}, store)
    assert "RELAY_HANDLER" not in env
