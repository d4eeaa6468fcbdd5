"""No error text of a failed attempt carries a secret's value: not the ledger, the DLQ
reason, the domain events nor the log lines. Delivery on fakes, with the real file
secret store where the bytes on disk matter."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from relay.adapters.fs.secrets import FileSecretStore
from relay.domain import events as ev
from tests.unit.delivery_world import World, rule

pytestmark = pytest.mark.anyio

CANARY = "canary-4b1d-in-the-bytes"
INSERT = b'{"table": "users", "id": 1}'
TEMPLATE = {
    "secrets": {"API_KEY": "api-key"},
    "events": [rule("events.created.handler", {"table": ["users"]}, retries=0)],
}


def everything_written(world: World, logs: list[MutableMapping[str, Any]]) -> list[str]:
    # InvocationCrashed carries the exception itself, in process, to the one log
    # line that shows its traceback (see the test below); no text is made of it.
    texts = [str(event) for event in world.events if not isinstance(event, ev.InvocationCrashed)]
    texts += [str(value) for h in world.ledger.hashes.values() for value in h.values()]
    texts += [entry.reason for _id, entry in world.dlq.entries]
    texts += [str(line) for line in logs]
    return texts


async def test_a_secret_that_is_not_utf8_fails_naming_the_secret_and_never_its_bytes(
    tmp_path: Path,
) -> None:
    store = FileSecretStore(tmp_path / "secrets")
    store.set("api-key", "placeholder")
    # written past `relay secret set` (which refuses it): invalid UTF-8 around the canary
    (tmp_path / "secrets" / "api-key").write_bytes(b"\xff\xfe" + CANARY.encode() + b"\x80")
    os.chmod(tmp_path / "secrets" / "api-key", 0o600)
    world = World(secrets=store)
    world.function("users", TEMPLATE)
    with capture_logs() as logs:
        report = await world.deliver(INSERT)
    assert (report.acknowledged, report.outcome) == (True, "dead_lettered")
    assert world.runtime.requests == []  # nothing ran with a half-read environment
    [(_id, entry)] = world.dlq.entries
    assert 'secret "api-key" is not valid UTF-8 text' in entry.reason
    assert "\n" not in entry.reason
    for text in everything_written(world, logs):
        assert CANARY not in text
        assert "\\xff" not in text


class _CrashingSecrets:
    """A secret store with a bug: its exception's message and repr hold the value."""

    def get(self, name: str) -> str:
        raise ValueError(f"could not parse {CANARY!r}")

    def names(self) -> list[str]:
        return []

    def set(self, name: str, value: str) -> None:
        raise NotImplementedError

    def remove(self, name: str) -> None:
        raise NotImplementedError


async def test_an_unexpected_exception_leaves_only_its_type_in_the_error_texts() -> None:
    world = World(secrets=_CrashingSecrets())
    world.function("users", TEMPLATE)
    report = await world.deliver(INSERT)
    assert (report.acknowledged, report.outcome) == (True, "dead_lettered")
    [exhausted] = world.of(ev.InvocationExhausted)
    assert "internal error (ValueError)" in exhausted.error
    [(_id, entry)] = world.dlq.entries
    assert "internal error (ValueError)" in entry.reason
    # the log keeps the traceback for whoever debugs the store; the texts that
    # are stored and shown to operators keep only the type
    for text in everything_written(world, []):
        assert CANARY not in text
