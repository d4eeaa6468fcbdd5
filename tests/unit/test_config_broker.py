"""RELAY_BROKER / RELAY_BROKER_PATH: choosing the broker, and what each needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.domain.errors import ConfigError
from relay.entrypoints.config import DEFAULT_BROKER_PATH, load_broker_settings, load_settings

REDIS = {"REDIS_URI": "localhost:6379", "REDIS_STREAM": "orders", "REDIS_GROUP": "workers"}


def test_redis_is_the_default_and_unchanged() -> None:
    s = load_settings(REDIS)
    assert s.broker.kind == "redis"
    assert not s.broker.embedded
    assert (s.redis.url, s.redis.stream, s.redis.group) == (
        "redis://localhost:6379", "orders", "workers",
    )


def test_redis_still_requires_its_variables() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"RELAY_BROKER": "redis"})
    lines = str(info.value).splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["REDIS_URI", "REDIS_STREAM", "REDIS_GROUP"]


def test_the_embedded_broker_needs_no_redis_and_has_default_names() -> None:
    s = load_settings({"RELAY_BROKER": "sqlite"})
    assert s.broker.embedded
    assert s.broker.path == DEFAULT_BROKER_PATH == Path("/var/lib/relay/broker.sqlite3")
    assert (s.redis.url, s.redis.stream, s.redis.group) == ("", "events", "relay")


def test_the_broker_path_and_names_can_be_moved() -> None:
    s = load_settings({"RELAY_BROKER": "SQLite", "RELAY_BROKER_PATH": "/data/q.sqlite3",
                       "REDIS_STREAM": "orders"})
    assert s.broker.path == Path("/data/q.sqlite3")
    assert (s.redis.stream, s.redis.group) == ("orders", "relay")


def test_an_unknown_broker_is_one_line_naming_the_accepted_ones() -> None:
    """Failure row 82: a typo never silently falls back to a broker."""
    with pytest.raises(ConfigError) as info:
        load_settings({"RELAY_BROKER": "kafka"})
    assert str(info.value) == "RELAY_BROKER='kafka' is invalid: one of redis, sqlite"


def test_admin_commands_read_the_same_choice() -> None:
    broker, redis = load_broker_settings({"RELAY_BROKER": "sqlite"}, need_group=False)
    assert broker.embedded
    assert redis.stream == "events"
