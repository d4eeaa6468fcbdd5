"""``INGEST_*``: HTTP ingest is opt-in, and never open to a network without a token."""

from __future__ import annotations

import pytest

from relay.domain.errors import ConfigError
from relay.domain.ingest import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_REQUESTS
from relay.entrypoints.config import IngestSettings, ListenAddress, load_settings
from relay.entrypoints.supervisor import child_env

BASE = {"REDIS_URI": "localhost:6379", "REDIS_STREAM": "events", "REDIS_GROUP": "relay"}


def problems(**env: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings({**BASE, **env})
    return str(info.value).splitlines()


def test_off_unless_ingest_addr_is_set() -> None:
    assert load_settings(BASE).ingest == IngestSettings()


@pytest.mark.parametrize("addr", ["127.0.0.1:8088", "localhost:8088", "[::1]:8088"])
def test_a_loopback_endpoint_may_go_without_a_token(addr: str) -> None:
    ingest = load_settings({**BASE, "INGEST_ADDR": addr}).ingest
    assert ingest.addr is not None
    assert ingest.token_secret is None
    assert (ingest.max_body_bytes, ingest.max_requests) == (
        DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_REQUESTS)


@pytest.mark.parametrize("addr", [":8088", "0.0.0.0:8088", "172.17.0.1:8088"])
def test_any_other_address_refuses_to_start_without_a_token_secret(addr: str) -> None:
    [line] = problems(INGEST_ADDR=addr)
    assert line.startswith("INGEST_TOKEN_SECRET is required: INGEST_ADDR ")
    assert "is not a loopback address" in line


def test_every_value_is_read_and_the_handler_url_gets_the_path() -> None:
    ingest = load_settings({
        **BASE, "INGEST_ADDR": ":8088", "INGEST_TOKEN_SECRET": "ingest-token",
        "INGEST_MAX_BODY_BYTES": "8MiB", "INGEST_MAX_REQUESTS": "4",
        "INGEST_HANDLER_URL": "http://relay:8088/",
    }).ingest
    assert ingest == IngestSettings(
        addr=ListenAddress("", 8088), token_secret="ingest-token", max_body_bytes=8 << 20,
        max_requests=4, handler_url="http://relay:8088/v1/events",
    )


def test_bad_values_are_one_line_each_and_a_pasted_token_is_never_printed() -> None:
    token = "Sup3r-Secret-Token/with+chars=="
    lines = problems(
        INGEST_ADDR="0.0.0.0:8088", INGEST_TOKEN_SECRET=token, INGEST_MAX_BODY_BYTES="100MiB",
        INGEST_MAX_REQUESTS="0", INGEST_HANDLER_URL="http://user:pw@relay:8088/x",
    )
    assert not any(token in line or "pw" in line for line in lines)
    assert [line.split("=", 1)[0].split(" ", 1)[0] for line in lines] == [
        "INGEST_TOKEN_SECRET", "INGEST_MAX_BODY_BYTES", "INGEST_HANDLER_URL",
        "INGEST_MAX_REQUESTS", "INGEST_TOKEN_SECRET",
    ]
    assert lines[0] == (f"INGEST_TOKEN_SECRET='<{len(token)} characters, not shown>' is invalid:"
                        " a secret name of lowercase letters, digits, '.', '_' and '-'")


def test_a_body_cap_below_one_event_and_settings_without_an_address_are_refused() -> None:
    [line] = problems(INGEST_ADDR="127.0.0.1:1", MAX_EVENT_BYTES="1MiB",
                      INGEST_MAX_BODY_BYTES="512KiB")
    assert line == ("INGEST_MAX_BODY_BYTES (524288) is below MAX_EVENT_BYTES (1048576):"
                    " one event must fit a request")
    assert problems(INGEST_TOKEN_SECRET="t", INGEST_HANDLER_URL="http://relay:1") == [
        "INGEST_TOKEN_SECRET is set but INGEST_ADDR is not: set INGEST_ADDR too",
        "INGEST_HANDLER_URL is set but INGEST_ADDR is not: set INGEST_ADDR too",
    ]


def test_each_process_of_processes_n_serves_ingest_on_its_own_port() -> None:
    env = {**BASE, "INGEST_ADDR": "127.0.0.1:8088"}
    settings = load_settings(env)
    assert child_env(env, settings, 0)["INGEST_ADDR"] == "127.0.0.1:8088"
    assert child_env(env, settings, 2)["INGEST_ADDR"] == "127.0.0.1:8090"
