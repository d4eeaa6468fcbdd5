"""A REDIS_URI can hold a password: no message Relay prints or logs about it may.
Every path a URI reaches a message by: the configuration error (``relay start`` and
the admin commands), ``relay health``, an unreachable server."""

from __future__ import annotations

import pytest

from relay.domain.errors import ConfigError
from relay.entrypoints.config import load_broker_settings, load_settings
from relay.entrypoints.health import check_health

BASE = {"REDIS_URI": "localhost:6379", "REDIS_STREAM": "events", "REDIS_GROUP": "relay"}


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("redis://user:canary-pw@host:6379/0", "redis://***@host:6379/0"),
        ("rediss://:canary-pw@host:6380", "rediss://***@host:6380"),
        ("redis://user:canary@pw@host:1", "redis://***@host:1"),  # an unescaped '@'
        ("redis://u:canary/pw#x@host:1", "redis://***@host:1"),  # '/' and '#' too
        ("user:canary-pw@host:6379", "***@host:6379"),
        ("redis://host:1/0?password=canary-pw&db=2", "redis://host:1/0?password=***&db=2"),
        ("redis://host:1/0?db=2&Username=canary-pw", "redis://host:1/0?db=2&Username=***"),
        ("redis://host:6379/0", "redis://host:6379/0"),
    ],
)
def test_redact_uri_masks_every_credential(uri: str, shown: str) -> None:
    from relay.entrypoints.config import redact_uri  # noqa: PLC0415 - new: keeps the others runnable without it

    assert redact_uri(uri) == shown


@pytest.mark.parametrize(
    "uri",
    [
        "redis://user:canary-pw@host:99999",
        "http://user:canary-pw@host:6379",
        "user:canary-pw@host:6379",
        "redis://user:canary-pw@",
        "redis://user:canary-pw@host:1/0?socket_timeout=soon",
        "redis://host:1/0?password=canary-pw&db=two",
    ],
)
@pytest.mark.anyio
async def test_a_rejected_redis_uri_never_prints_its_password(uri: str) -> None:
    for loader in (
        lambda: load_settings({**BASE, "REDIS_URI": uri}),
        lambda: load_broker_settings({**BASE, "REDIS_URI": uri}, need_group=False),
    ):
        with pytest.raises(ConfigError) as caught:
            loader()
        assert str(caught.value).startswith("REDIS_URI=")
        assert "canary-pw" not in str(caught.value)
        assert "\n" not in str(caught.value)
    problem = await check_health({"REDIS_URI": uri})
    assert problem is not None
    assert "canary-pw" not in problem


def test_a_query_parameter_redis_py_refuses_fails_startup_in_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({**BASE, "REDIS_URI": "redis://h:1/0?socket_timeout=soon"})
    assert str(caught.value) == (
        "REDIS_URI='redis://h:1/0?socket_timeout=soon' is invalid (Invalid value for "
        "'socket_timeout' in connection URL): host:port, redis://[user:password@]host:port "
        "or rediss://..."
    )


@pytest.mark.anyio
async def test_an_unreachable_redis_is_named_by_host_and_port_only() -> None:
    problem = await check_health({"REDIS_URI": "redis://user:canary-pw@127.0.0.1:1/0"})
    assert problem is not None
    assert problem.startswith("redis at 127.0.0.1:1 is unreachable")
    assert "canary-pw" not in problem
