"""CONSOLE_ADDR, CONSOLE_TOKEN_SECRET and the RUN_HISTORY_* limits (issue 34)."""

from __future__ import annotations

import pytest

from relay.domain import run_history as rh
from relay.domain.durations import DAY, HOUR
from relay.domain.errors import ConfigError
from relay.entrypoints.config import load_settings
from relay.entrypoints.supervisor import child_env

EMBEDDED = {"RELAY_BROKER": "sqlite"}


def test_the_console_is_off_and_the_history_has_its_defaults_unless_set() -> None:
    observe = load_settings(EMBEDDED).observe
    assert not observe.console.enabled
    assert (observe.run_history.limit, observe.run_history.retention_ns,
            observe.run_history.rollup_retention_ns) == (10_000, 7 * DAY, 2 * DAY)
    assert rh.DEFAULT_LIMIT == 10_000


@pytest.mark.parametrize(("value", "host", "port"), [
    (":8089", "127.0.0.1", 8089),
    ("8089", "127.0.0.1", 8089),
    ("localhost:8089", "localhost", 8089),
    ("[::1]:8089", "::1", 8089),
])
def test_a_port_alone_binds_loopback_and_needs_no_token(value: str, host: str, port: int) -> None:
    console = load_settings({**EMBEDDED, "CONSOLE_ADDR": value}).observe.console
    assert (console.host, console.port, console.loopback) == (host, port, True)
    assert console.token_secret is None


def test_beyond_loopback_the_token_secret_is_required() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({**EMBEDDED, "CONSOLE_ADDR": "0.0.0.0:8089"})
    [line] = str(info.value).splitlines()
    assert line.startswith("CONSOLE_TOKEN_SECRET is required when CONSOLE_ADDR binds beyond")
    console = load_settings({**EMBEDDED, "CONSOLE_ADDR": "0.0.0.0:8089",
                             "CONSOLE_TOKEN_SECRET": "console-token"}).observe.console
    assert (console.loopback, console.token_secret) == (False, "console-token")


@pytest.mark.parametrize("value", ["0", "99999", "host name:80", "a:b", "::bad host:1"])
def test_an_invalid_console_addr_is_one_line(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^CONSOLE_ADDR=.* is invalid: a listen address"):
        load_settings({**EMBEDDED, "CONSOLE_ADDR": value})


def test_the_history_limits_are_read_and_checked() -> None:
    values = load_settings({**EMBEDDED, "RUN_HISTORY_LIMIT": "500",
                            "RUN_HISTORY_RETENTION": "12h",
                            "RUN_ROLLUP_RETENTION": "1d"}).observe.run_history
    assert (values.limit, values.retention_ns, values.rollup_retention_ns) == (
        500, 12 * HOUR, DAY)
    off = load_settings({**EMBEDDED, "RUN_HISTORY_LIMIT": "0"}).observe.run_history
    assert off.limit == 0  # the run history is off
    with pytest.raises(ConfigError) as info:
        load_settings({**EMBEDDED, "RUN_HISTORY_LIMIT": "-1", "RUN_HISTORY_RETENTION": "-1h"})
    assert [line.split("=", 1)[0] for line in str(info.value).splitlines()] == [
        "RUN_HISTORY_LIMIT", "RUN_HISTORY_RETENTION"]


def test_only_the_first_of_several_processes_serves_the_console() -> None:
    env = {**EMBEDDED, "CONSOLE_ADDR": ":8089"}
    settings = load_settings(env)
    assert child_env(env, settings, 0)["CONSOLE_ADDR"] == ":8089"
    assert "CONSOLE_ADDR" not in child_env(env, settings, 1)
