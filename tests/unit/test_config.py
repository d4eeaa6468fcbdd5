"""Every configuration rule of the spec, with its accepted and rejected forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.domain.durations import HOUR, MINUTE, SECOND
from relay.domain.errors import ConfigError
from relay.entrypoints.config import (
    ListenAddress,
    load_broker_settings,
    load_dedup_window,
    load_settings,
)

BASE = {"REDIS_URI": "localhost:6379", "REDIS_STREAM": "events", "REDIS_GROUP": "relay"}


def load(**overrides: str) -> object:
    return load_settings({**BASE, **overrides})


def rejects(var: str, value: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings({**BASE, var: value})
    message = str(info.value)
    assert var in message
    assert "\n" not in message  # one line per problem, one problem here
    return message


def test_defaults() -> None:
    s = load_settings(BASE)
    assert s.redis.url == "redis://localhost:6379"
    assert (s.redis.stream, s.redis.group) == ("events", "relay")
    assert s.max_concurrency == 8
    assert s.max_buffered_events == 16
    assert s.warm_idle_timeout_ns == 5 * MINUTE
    assert s.stream_retention_ns is None
    assert s.metrics_addr is None
    assert s.git_webhook_addr is None
    assert s.log_level == "INFO"
    assert s.networks == ()
    assert s.max_event_bytes == 256 * 1024
    assert s.traefik.priority is None
    assert s.paths.database == Path("/var/lib/relay/db.sqlite3")
    assert s.paths.socket == Path("/run/relay/relay.sock")
    assert s.hostname


@pytest.mark.parametrize("var", ["REDIS_URI", "REDIS_STREAM", "REDIS_GROUP"])
@pytest.mark.parametrize("value", [None, "", "   "])
def test_required_redis_variables(var: str, value: str | None) -> None:
    env = dict(BASE)
    if value is None:
        del env[var]
    else:
        env[var] = value
    with pytest.raises(ConfigError, match=f"{var} is required"):
        load_settings(env)


def test_all_problems_reported_one_line_each() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"MAX_CONCURRENCY": "0", "LOG_LEVEL": "loud"})
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    assert {line.split()[0] for line in lines} == {
        "REDIS_URI",
        "MAX_CONCURRENCY='0'",
        "LOG_LEVEL='loud'",
    }


def test_no_broker_at_all_is_one_line_naming_the_embedded_broker() -> None:
    """Row 275: a first `relay start` with nothing set says how to start without Redis."""
    with pytest.raises(ConfigError) as info:
        load_settings({})
    [line] = str(info.value).splitlines()
    assert line.startswith("REDIS_URI is required: host:port")
    assert "relay start --embedded" in line


def test_some_redis_setting_given_keeps_the_line_per_missing_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"REDIS_GROUP": "relay"})
    lines = str(info.value).splitlines()
    assert [line.split()[0] for line in lines] == ["REDIS_URI", "REDIS_STREAM"]


@pytest.mark.parametrize(
    ("uri", "url"),
    [
        ("redis:6379", "redis://redis:6379"),
        ("10.0.0.5:6380", "redis://10.0.0.5:6380"),
        ("redis://user:pw@host:6379", "redis://user:pw@host:6379"),
        ("redis://host:6379/2", "redis://host:6379/2"),
        ("rediss://user:pw@host:6380", "rediss://user:pw@host:6380"),
        ("  redis:6379  ", "redis://redis:6379"),
    ],
)
def test_redis_uri_accepted(uri: str, url: str) -> None:
    assert load_settings({**BASE, "REDIS_URI": uri}).redis.url == url


@pytest.mark.parametrize(
    "uri",
    [
        "redis",
        "redis:",
        ":6379",
        "redis:abc",
        "redis:70000",
        "http://host:6379",
        "redis://",
        "redis://host:99999",
        "unix:///tmp/r.sock",
        "a b:6379",
    ],
)
def test_redis_uri_rejected(uri: str) -> None:
    assert "host:port" in rejects("REDIS_URI", uri)


@pytest.mark.parametrize("var", ["MAX_CONCURRENCY", "MAX_BUFFERED_EVENTS"])
@pytest.mark.parametrize(("value", "expected"), [("1", 1), ("32", 32), (" 4 ", 4)])
def test_positive_integers_accepted(var: str, value: str, expected: int) -> None:
    s = load_settings({**BASE, var: value})
    assert getattr(s, var.lower()) == expected


@pytest.mark.parametrize("var", ["MAX_CONCURRENCY", "MAX_BUFFERED_EVENTS", "TRAEFIK_PRIORITY"])
@pytest.mark.parametrize("value", ["0", "-1", "1.5", "abc", "+3", "1e3", "true"])
def test_positive_integers_rejected(var: str, value: str) -> None:
    assert "a positive integer" in rejects(var, value)


@pytest.mark.parametrize(
    ("value", "ns"),
    [
        ("90s", 90 * SECOND),
        ("1h30m", HOUR + 30 * MINUTE),
        ("1.5s", 1_500_000_000),
        ("5m", 5 * MINUTE),
        ("300ms", 300_000_000),
        ("7d", 7 * 24 * HOUR),
        ("1d12h", 36 * HOUR),
    ],
)
def test_durations_accepted(value: str, ns: int) -> None:
    s = load_settings(
        {**BASE, "WARM_CONTAINER_IDLE_TIMEOUT": value, "REDIS_STREAM_RETENTION": value}
    )
    assert s.warm_idle_timeout_ns == ns
    assert s.stream_retention_ns == ns


@pytest.mark.parametrize(
    "var", ["WARM_CONTAINER_IDLE_TIMEOUT", "REDIS_STREAM_RETENTION", "PUBLISH_DEDUP_WINDOW"]
)
@pytest.mark.parametrize("value", ["300", "0s", "0", "-5m", "5 minutes", "1 d", "abc", "m"])
def test_durations_rejected(var: str, value: str) -> None:
    assert "positive duration" in rejects(var, value)


@pytest.mark.parametrize("var", ["WARM_CONTAINER_IDLE_TIMEOUT", "REDIS_STREAM_RETENTION"])
def test_empty_duration_means_default(var: str) -> None:
    s = load_settings({**BASE, var: ""})
    assert s.warm_idle_timeout_ns == 5 * MINUTE
    assert s.stream_retention_ns is None


@pytest.mark.parametrize(
    ("value", "ns"), [("", 24 * HOUR), ("2h", 2 * HOUR), ("7d", 7 * 24 * HOUR)]
)
def test_publish_dedup_window(value: str, ns: int) -> None:
    assert load_settings({**BASE, "PUBLISH_DEDUP_WINDOW": value}).publish_dedup_window_ns == ns
    assert load_dedup_window({"PUBLISH_DEDUP_WINDOW": value}) == ns


@pytest.mark.parametrize(
    ("value", "ns"), [("", 48 * HOUR), ("12h", 12 * HOUR), ("1h", HOUR), ("90m", 90 * MINUTE)]
)
def test_ledger_retention_accepted(value: str, ns: int) -> None:
    assert load_settings({**BASE, "LEDGER_RETENTION": value}).ledger_retention_ns == ns


@pytest.mark.parametrize("value", ["59m", "30s", "0", "0h", "-2h", "48", "two days"])
def test_ledger_retention_rejected(value: str) -> None:
    assert "a duration of at least 1h" in rejects("LEDGER_RETENTION", value)


@pytest.mark.parametrize(
    ("value", "level"),
    [("DEBUG", "DEBUG"), ("info", "INFO"), (" Warn ", "WARN"), ("error", "ERROR"), ("", "INFO")],
)
def test_log_level_accepted(value: str, level: str) -> None:
    assert load_settings({**BASE, "LOG_LEVEL": value}).log_level == level


@pytest.mark.parametrize("value", ["WARNING", "TRACE", "verbose", "1"])
def test_log_level_rejected(value: str) -> None:
    assert "DEBUG, INFO, WARN, ERROR" in rejects("LOG_LEVEL", value)


@pytest.mark.parametrize(
    ("value", "log_format"),
    [("", "console"), ("json", "json"), (" LOGFMT ", "logfmt"), ("Console", "console")],
)
def test_log_format_accepted(value: str, log_format: str) -> None:
    assert load_settings({**BASE, "LOG_FORMAT": value}).log_format == log_format


@pytest.mark.parametrize("value", ["text", "slog", "yaml", "jsonl"])
def test_log_format_rejected_in_one_line(value: str) -> None:
    """Row 278."""
    assert rejects("LOG_FORMAT", value) == (
        f"LOG_FORMAT={value!r} is invalid: one of console, logfmt, json"
    )


@pytest.mark.parametrize(
    ("value", "networks"),
    [
        ("backend,monitoring", ("backend", "monitoring")),
        (" backend , ,monitoring,", ("backend", "monitoring")),
        ("b,a,b,c,a", ("b", "a", "c")),
        ("", ()),
        (" , ,", ()),
    ],
)
def test_networks_list(value: str, networks: tuple[str, ...]) -> None:
    assert load_settings({**BASE, "NETWORKS": value}).networks == networks


def test_traefik_settings() -> None:
    s = load_settings(
        {
            **BASE,
            "TRAEFIK_NETWORK": "proxy",
            "TRAEFIK_ENTRYPOINTS": "web, websecure",
            "TRAEFIK_CERTRESOLVER": "le",
            "TRAEFIK_PRIORITY": "100",
            "TRAEFIK_HOST_OVERRIDE": "localhost",
        }
    )
    assert s.traefik.network == "proxy"
    assert s.traefik.entrypoints == ("web", "websecure")
    assert s.traefik.certresolver == "le"
    assert s.traefik.priority == 100
    assert s.traefik.host_override == "localhost"


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("TRAEFIK_HOST_OVERRIDE", "localhost`)||Host(`victim.example.com"),
        ("TRAEFIK_HOST_OVERRIDE", "a b"),
        ("TRAEFIK_NETWORK", "proxy`"),
        ("TRAEFIK_ENTRYPOINTS", "web, web(secure)"),
        ("TRAEFIK_CERTRESOLVER", "le|x"),
    ],
)
def test_traefik_values_with_rule_syntax_are_refused(var: str, value: str) -> None:
    """Each reaches a Traefik label; none may carry rule syntax into it."""
    line = rejects(var, value)
    assert line.startswith(f"{var}=")
    assert "\n" not in line


@pytest.mark.parametrize(
    ("value", "addr"),
    [
        (":9090", ListenAddress("", 9090)),
        ("127.0.0.1:9100", ListenAddress("127.0.0.1", 9100)),
        ("[::1]:9100", ListenAddress("::1", 9100)),
    ],
)
def test_listen_addresses(value: str, addr: ListenAddress) -> None:
    s = load_settings({**BASE, "METRICS_ADDR": value, "GIT_WEBHOOK_ADDR": value})
    assert s.metrics_addr == addr
    assert s.git_webhook_addr == addr


@pytest.mark.parametrize("var", ["METRICS_ADDR", "GIT_WEBHOOK_ADDR"])
@pytest.mark.parametrize("value", ["9090", "host:", "host:http", ":0", ":70000"])
def test_listen_addresses_rejected(var: str, value: str) -> None:
    assert "listen address" in rejects(var, value)


@pytest.mark.parametrize(
    ("value", "size"), [("1024", 1024), ("64KiB", 64 * 1024), ("1MiB", 1024 * 1024)]
)
def test_max_event_bytes(value: str, size: int) -> None:
    assert load_settings({**BASE, "MAX_EVENT_BYTES": value}).max_event_bytes == size


@pytest.mark.parametrize("value", ["0", "2MiB", "1048577", "-1", "big", "1GiB"])
def test_max_event_bytes_rejected(value: str) -> None:
    assert "1MiB" in rejects("MAX_EVENT_BYTES", value)


def test_paths_and_hostname_overridable() -> None:
    s = load_settings(
        {
            **BASE,
            "RELAY_STATE_DIR": "/tmp/s",
            "RELAY_RUN_DIR": "/tmp/r",
            "RELAY_HOSTNAME": "worker-a",
        }
    )
    assert s.paths.database == Path("/tmp/s/db.sqlite3")
    assert s.paths.secrets_dir == Path("/tmp/s/secrets")
    assert s.hostname == "worker-a"
    assert s.paths.direct_dir == Path("/tmp/r/containers")
    assert s.paths.shared_direct_dir is None
    blank = load_settings({**BASE, "RELAY_RUN_DIR": " ", "RELAY_STATE_DIR": ""})
    assert (blank.paths.run_dir, blank.paths.state_dir) == (
        Path("/run/relay"), Path("/var/lib/relay"))


def test_a_shared_direct_directory_replaces_the_run_directorys() -> None:
    s = load_settings({**BASE, "RELAY_DIRECT_DIR": "/run/relay-sockets/w/containers"})
    assert s.paths.direct_dir == Path("/run/relay-sockets/w/containers")
    assert s.paths.shared_direct_dir == s.paths.direct_dir
    blank = load_settings({**BASE, "RELAY_DIRECT_DIR": " "})  # compose's `RELAY_DIRECT_DIR=`
    assert blank.paths.shared_direct_dir is None


def test_broker_settings_for_admin_commands() -> None:
    r = load_broker_settings({"REDIS_URI": "h:1", "REDIS_STREAM": "s"}, need_group=False)[1]
    assert (r.url, r.stream, r.group) == ("redis://h:1", "s", "")
    with pytest.raises(ConfigError, match="REDIS_GROUP is required"):
        load_broker_settings({"REDIS_URI": "h:1", "REDIS_STREAM": "s"})[1]


def test_recovery_cadence_defaults_and_test_knobs() -> None:
    s = load_settings(BASE)
    assert (s.recovery.interval_s, s.recovery.min_idle_ms) == (60.0, 60_000)
    fast = load_settings(
        {**BASE, "RELAY_TEST_RECOVERY_INTERVAL": "500ms", "RELAY_TEST_RECOVERY_MIN_IDLE": "1s"}
    )
    assert (fast.recovery.interval_s, fast.recovery.min_idle_ms) == (0.5, 1000)
    assert "test-only" in rejects("RELAY_TEST_RECOVERY_INTERVAL", "0s")


@pytest.mark.parametrize(
    ("value", "ns"), [("", 30 * SECOND), ("  ", 30 * SECOND), ("2m", 2 * MINUTE), ("0s", 0)]
)
def test_shutdown_grace_accepted(value: str, ns: int) -> None:
    assert load_settings({**BASE, "SHUTDOWN_GRACE": value}).shutdown_grace_ns == ns


@pytest.mark.parametrize("value", ["30", "-5s", "5 minutes", "1 d", "abc", "s"])
def test_shutdown_grace_rejected(value: str) -> None:
    assert rejects("SHUTDOWN_GRACE", value) == (
        f"SHUTDOWN_GRACE={value!r} is invalid: a duration of 0s or more, such as 30s or 2m"
    )
