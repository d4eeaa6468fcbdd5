"""Configuration: every environment variable read once, at the entrypoint.

:func:`load_settings` turns a mapping (``os.environ`` in production, a dict in tests)
into a frozen :class:`Settings`. Every rule of the spec's configuration table is
enforced here; an invalid value raises :class:`ConfigError` whose message lists one
line per problem, each naming the variable and what it accepts.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from relay.domain.durations import MINUTE, SECOND, DurationError, parse_setting_duration
from relay.domain.errors import ConfigError
from relay.domain.ingest import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_REQUESTS, HARD_MAX_BODY_BYTES
from relay.domain.ingest import PATH as INGEST_PATH
from relay.domain.invocation import LEDGER_RETENTION_NS, MIN_LEDGER_RETENTION_NS
from relay.domain.names import hostname_problem, secret_name_error
from relay.domain.publication import DEFAULT_DEDUP_WINDOW_NS
from relay.entrypoints.config_console import ObserveSettings, observe_settings

T = TypeVar("T")

LOG_LEVELS = ("DEBUG", "INFO", "WARN", "ERROR")
LOG_FORMATS = ("console", "logfmt", "json")  # relay.entrypoints.logging draws each
KIB = 1024
MIB = 1024 * KIB
DEFAULT_MAX_EVENT_BYTES = 256 * KIB
HARD_MAX_EVENT_BYTES = 1 * MIB
DEFAULT_STATE_DIR = Path("/var/lib/relay")
DEFAULT_RUN_DIR = Path("/run/relay")
DEFAULT_FUNCTIONS_DIR = Path("/functions")
# How long a stopping worker lets in-flight invocations finish (SHUTDOWN_GRACE).
DEFAULT_SHUTDOWN_GRACE_NS = 30 * SECOND
BROKERS = ("redis", "sqlite")
DEFAULT_BROKER_PATH = DEFAULT_STATE_DIR / "broker.sqlite3"
EMBEDDED_STREAM = "events"  # the stream and group names on the embedded broker
EMBEDDED_GROUP = "relay"


@dataclass(frozen=True, slots=True)
class ListenAddress:
    """A ``host:port`` listen address; an empty host means every interface."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Paths:
    """Where Relay keeps state. Fixed in production; injectable for tests and host runs."""

    state_dir: Path = DEFAULT_STATE_DIR
    run_dir: Path = DEFAULT_RUN_DIR
    # RELAY_DIRECT_DIR: a directory the engine sees at this same path (a host
    # directory bind-mounted at its own path), for the per-container sockets when
    # the engine is reached over TCP (docs/deployment.md)
    shared_direct_dir: Path | None = None

    @property
    def database(self) -> Path:
        return self.state_dir / "db.sqlite3"

    @property
    def secrets_dir(self) -> Path:
        return self.state_dir / "secrets"

    @property
    def socket(self) -> Path:
        """The worker's control socket: a lone worker's, or under ``relay start
        --processes N`` (one run directory ``<run_dir>/<i>`` per process) the first
        process's."""
        own = self.run_dir / "relay.sock"
        first = self.run_dir / "0" / "relay.sock"
        return first if not own.exists() and first.exists() else own

    @property
    def sockets(self) -> list[Path]:
        """Every worker's control socket here: the lone worker's, or one per process."""
        own = self.run_dir / "relay.sock"
        if own.exists():
            return [own]
        found = [p for p in self.run_dir.glob("*/relay.sock") if p.parent.name.isdigit()]
        return sorted(found, key=lambda p: int(p.parent.name)) or [own]

    @property
    def direct_dir(self) -> Path:
        """Where the sockets mounted into execution containers live."""
        return self.shared_direct_dir or self.run_dir / "containers"


@dataclass(frozen=True, slots=True)
class RedisSettings:
    url: str
    stream: str
    group: str


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Which broker delivers events: ``redis`` (the default) or ``sqlite`` (the
    embedded broker file at ``path``)."""

    kind: str = "redis"
    path: Path = DEFAULT_BROKER_PATH

    @property
    def embedded(self) -> bool:
        return self.kind == "sqlite"

    @property
    def file(self) -> Path | None:
        """The broker's own file (the embedded broker), or ``None`` (Redis)."""
        return self.path if self.embedded else None


@dataclass(frozen=True, slots=True)
class TraefikSettings:
    network: str | None = None
    entrypoints: tuple[str, ...] = ()
    certresolver: str | None = None
    priority: int | None = None
    host_override: str | None = None


@dataclass(frozen=True, slots=True)
class IngestSettings:
    """HTTP ingest (``INGEST_*``); ``addr is None``: off."""

    addr: ListenAddress | None = None
    token_secret: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_requests: int = DEFAULT_MAX_REQUESTS
    handler_url: str | None = None
    """``RELAY_INGEST_URL`` of the handlers: ``INGEST_HANDLER_URL`` plus the path."""


@dataclass(frozen=True, slots=True)
class RecoverySettings:
    """The recovery loop's cadence. Fixed by the spec (every 1m, for messages idle
    1m); ``RELAY_TEST_RECOVERY_INTERVAL``/``RELAY_TEST_RECOVERY_MIN_IDLE`` exist only
    so end-to-end tests of the failure table do not wait minutes per case."""

    interval_s: float = 60.0
    min_idle_ms: int = 60_000


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``relay start`` needs from the environment, validated."""

    redis: RedisSettings
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    stream_retention_ns: int | None = None
    dlq_retention_ns: int | None = None
    """``DLQ_RETENTION``: dead letters older than this are deleted; ``None`` keeps all."""
    ledger_retention_ns: int = LEDGER_RETENTION_NS
    metrics_addr: ListenAddress | None = None
    git_webhook_addr: ListenAddress | None = None
    log_level: str = "INFO"
    log_format: str = "console"
    max_concurrency: int = 8
    max_buffered_events: int = 16
    networks: tuple[str, ...] = ()
    warm_idle_timeout_ns: int = 5 * MINUTE
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    shutdown_grace_ns: int = DEFAULT_SHUTDOWN_GRACE_NS
    publish_dedup_window_ns: int = DEFAULT_DEDUP_WINDOW_NS
    """``PUBLISH_DEDUP_WINDOW``: how long an idempotency key answers with its first id."""
    traefik: TraefikSettings = field(default_factory=TraefikSettings)
    ingest: IngestSettings = field(default_factory=IngestSettings)
    hostname: str = ""
    paths: Paths = field(default_factory=Paths)
    recovery: RecoverySettings = field(default_factory=RecoverySettings)
    observe: ObserveSettings = field(default_factory=ObserveSettings)
    """The web console and the run history (issue 34; :mod:`config_console`)."""
    process: int = 0
    """``RELAY_PROCESS_INDEX``, set by ``relay start --processes N`` for its children:
    0 for a lone worker and the first child (it alone converges services and keeps
    the state database's stats), 1..N-1 for the others."""


class _Collector:
    """Reads variables and remembers every problem, so all are reported at once."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[str] = []

    def raw(self, name: str) -> str | None:
        value = self.env.get(name)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def required(self, name: str, accepts: str) -> str:
        value = self.raw(name)
        if value is None:
            self.problems.append(f"{name} is required: {accepts}")
            return ""
        return value

    def parse(
        self,
        name: str,
        parser: Callable[[str], T],
        default: T,
        accepts: str,
        *,
        shown: Callable[[str], str] = str,
    ) -> T:
        """``shown`` turns the raw value into what the problem line may print
        (:func:`redact_uri` for a value that can hold a password)."""
        value = self.raw(name)
        if value is None:
            return default
        try:
            return parser(value)
        except ValueError as exc:
            why = f" ({exc.args[0]})" if isinstance(exc, InvalidValue) else ""
            raw = shown(self.env.get(name, ""))
            self.problems.append(f"{name}={raw!r} is invalid{why}: {accepts}")
            return default


def load_settings(env: Mapping[str, str]) -> Settings:
    """Validate the environment into :class:`Settings` or raise :class:`ConfigError`."""
    c = _Collector(env)
    broker = _broker(c)
    settings = Settings(
        redis=_delivery(c, broker, need_stream=True, need_group=True),
        broker=broker,
        stream_retention_ns=c.parse(
            "REDIS_STREAM_RETENTION", positive_duration, None, "a positive duration such as 6h"
        ),
        dlq_retention_ns=c.parse(
            "DLQ_RETENTION", positive_duration, None, "a positive duration such as 168h or 7d"
        ),
        ledger_retention_ns=c.parse(
            "LEDGER_RETENTION",
            parse_ledger_retention,
            LEDGER_RETENTION_NS,
            "a duration of at least 1h, such as 12h or 7d",
        ),
        metrics_addr=c.parse("METRICS_ADDR", parse_listen_address, None, _ADDR_ACCEPTS),
        git_webhook_addr=c.parse("GIT_WEBHOOK_ADDR", parse_listen_address, None, _ADDR_ACCEPTS),
        log_level=c.parse("LOG_LEVEL", parse_log_level, "INFO", "one of DEBUG, INFO, WARN, ERROR"),
        log_format=c.parse(
            "LOG_FORMAT", parse_log_format, "console", "one of " + ", ".join(LOG_FORMATS)
        ),
        max_concurrency=c.parse("MAX_CONCURRENCY", positive_int, 8, "a positive integer"),
        max_buffered_events=c.parse("MAX_BUFFERED_EVENTS", positive_int, 16, "a positive integer"),
        networks=parse_list(env.get("NETWORKS", "")),
        warm_idle_timeout_ns=c.parse(
            "WARM_CONTAINER_IDLE_TIMEOUT",
            positive_duration,
            5 * MINUTE,
            "a positive duration such as 90s or 5m",
        ),
        max_event_bytes=c.parse(
            EVENT_BYTES_VARIABLE,
            parse_event_bytes,
            DEFAULT_MAX_EVENT_BYTES,
            f"{EVENT_BYTES_ACCEPTS}, in bytes or with a KiB/MiB suffix",
        ),
        shutdown_grace_ns=c.parse(
            "SHUTDOWN_GRACE",
            non_negative_duration,
            DEFAULT_SHUTDOWN_GRACE_NS,
            "a duration of 0s or more, such as 30s or 2m",
        ),
        publish_dedup_window_ns=_dedup_window(c),
        traefik=TraefikSettings(
            network=c.parse("TRAEFIK_NETWORK", parse_traefik_name, None, _NAME_ACCEPTS),
            entrypoints=c.parse("TRAEFIK_ENTRYPOINTS", parse_traefik_names, (),
                                "a comma list of " + _NAME_ACCEPTS),
            certresolver=c.parse("TRAEFIK_CERTRESOLVER", parse_traefik_name, None, _NAME_ACCEPTS),
            priority=c.parse("TRAEFIK_PRIORITY", positive_int, None, "a positive integer"),
            host_override=c.parse("TRAEFIK_HOST_OVERRIDE", parse_hostname, None,
                                  "a hostname such as localhost or example.com"),
        ),
        ingest=_ingest(c),
        hostname=c.raw("RELAY_HOSTNAME") or socket.gethostname(),
        paths=load_paths(env),
        observe=observe_settings(c, positive_duration),
        process=c.parse("RELAY_PROCESS_INDEX", int, 0, "a whole number (set by --processes)"),
        recovery=RecoverySettings(
            interval_s=c.parse(
                "RELAY_TEST_RECOVERY_INTERVAL", positive_duration, 60 * 10**9, _TEST_ONLY
            )
            / 1e9,
            min_idle_ms=c.parse(
                "RELAY_TEST_RECOVERY_MIN_IDLE", positive_duration, 60 * 10**9, _TEST_ONLY
            )
            // 10**6,
        ),
    )
    if c.problems:
        raise ConfigError("\n".join(c.problems))
    return settings


def _dedup_window(c: _Collector) -> int:
    return c.parse(
        "PUBLISH_DEDUP_WINDOW", positive_duration, DEFAULT_DEDUP_WINDOW_NS,
        "a positive duration such as 24h or 7d",
    )


def load_dedup_window(env: Mapping[str, str]) -> int:
    """``PUBLISH_DEDUP_WINDOW`` alone, for ``relay publish`` (or :class:`ConfigError`)."""
    c = _Collector(env)
    window = _dedup_window(c)
    if c.problems:
        raise ConfigError("\n".join(c.problems))
    return window


def load_paths(env: Mapping[str, str]) -> Paths:
    """State and run directories. ``RELAY_STATE_DIR``/``RELAY_RUN_DIR`` exist for tests
    and host-side runs; in a container the fixed defaults are what you want."""
    state = env.get("RELAY_STATE_DIR", "").strip()
    run = env.get("RELAY_RUN_DIR", "").strip()
    shared = env.get("RELAY_DIRECT_DIR", "").strip()
    return Paths(
        state_dir=Path(state) if state else DEFAULT_STATE_DIR,
        run_dir=Path(run) if run else DEFAULT_RUN_DIR,
        shared_direct_dir=Path(shared) if shared else None,
    )


def load_broker_settings(
    env: Mapping[str, str], *, need_stream: bool = True, need_group: bool = True
) -> tuple[BrokerSettings, RedisSettings]:
    """The broker choice and its stream settings, for admin commands: with the
    embedded broker ``REDIS_URI`` is not required and the names have defaults."""
    c = _Collector(env)
    broker = _broker(c)
    redis = _delivery(c, broker, need_stream=need_stream, need_group=need_group)
    if c.problems:
        raise ConfigError("\n".join(c.problems))
    return broker, redis


def load_broker_choice(env: Mapping[str, str]) -> BrokerSettings:
    """``RELAY_BROKER`` and ``RELAY_BROKER_PATH`` alone, for commands that touch the
    broker file but never Redis (``relay backup``): no Redis variable is required."""
    c = _Collector(env)
    broker = _broker(c)
    if c.problems:
        raise ConfigError("\n".join(c.problems))
    return broker


def _broker(c: _Collector) -> BrokerSettings:
    """``RELAY_BROKER`` (redis or sqlite) and ``RELAY_BROKER_PATH``."""
    kind = (c.raw("RELAY_BROKER") or "redis").lower()
    if kind not in BROKERS:
        shown = (c.raw("RELAY_BROKER") or "")[:40]
        c.problems.append(f"RELAY_BROKER={shown!r} is invalid: one of redis, sqlite")
        kind = ""  # no broker: its own variables are not asked for
    path = c.raw("RELAY_BROKER_PATH")
    return BrokerSettings(kind=kind, path=Path(path) if path else DEFAULT_BROKER_PATH)


def _delivery(
    c: _Collector, broker: BrokerSettings, *, need_stream: bool, need_group: bool
) -> RedisSettings:
    if broker.kind == "":
        return RedisSettings(url="", stream="", group="")
    if not broker.embedded:
        return _redis(c, need_stream=need_stream, need_group=need_group)
    return RedisSettings(
        url="",
        stream=c.raw("REDIS_STREAM") or EMBEDDED_STREAM,
        group=c.raw("REDIS_GROUP") or EMBEDDED_GROUP,
    )


def _redis(c: _Collector, *, need_stream: bool, need_group: bool) -> RedisSettings:
    """``REDIS_URI`` (required, validated), and the stream and group when needed."""
    if not any(c.raw(name) for name in ("RELAY_BROKER", *_REDIS_VARIABLES)):
        # nothing chosen at all (a first run): one line that names both ways to start,
        # instead of three "is required" lines that never mention the embedded broker
        c.problems.append(_NO_BROKER)
        return RedisSettings(url="", stream="", group="")
    uri = c.required("REDIS_URI", _REDIS_URI_ACCEPTS)
    stream = c.required("REDIS_STREAM", "the name of the stream to consume") if need_stream else ""
    group = c.required("REDIS_GROUP", "the consumer group name") if need_group else ""
    url = (
        c.parse("REDIS_URI", parse_redis_uri, "", _REDIS_URI_ACCEPTS, shown=redact_uri)
        if uri
        else ""
    )
    return RedisSettings(url=url, stream=stream, group=group)


def _ingest(c: _Collector) -> IngestSettings:
    """``INGEST_*``: an endpoint on anything but loopback needs a token secret."""
    addr = c.parse("INGEST_ADDR", parse_listen_address, None, _ADDR_ACCEPTS)
    # a token pasted where its name belongs must not be printed back
    secret = c.parse("INGEST_TOKEN_SECRET", parse_secret_name, None, _SECRET_ACCEPTS,
                     shown=lambda v: f"<{len(v)} characters, not shown>")
    try:
        event_bytes = parse_event_bytes(c.raw("MAX_EVENT_BYTES") or str(DEFAULT_MAX_EVENT_BYTES))
    except ValueError:
        event_bytes = 0  # MAX_EVENT_BYTES has its own problem line
    body = c.parse("INGEST_MAX_BODY_BYTES", parse_body_bytes, DEFAULT_MAX_BODY_BYTES,
                   "a size from 1KiB to 64MiB, in bytes or with a KiB/MiB suffix")
    handler = c.parse("INGEST_HANDLER_URL", parse_http_url, None,
                      "a base URL such as http://relay:8088 (no path, query or credentials)",
                      shown=redact_uri)
    settings = IngestSettings(
        addr=addr,
        token_secret=secret,
        max_body_bytes=body,
        max_requests=c.parse("INGEST_MAX_REQUESTS", positive_int, DEFAULT_MAX_REQUESTS,
                             "a positive integer"),
        handler_url=handler + INGEST_PATH if handler else None,
    )
    if addr is None:
        for name in ("INGEST_TOKEN_SECRET", "INGEST_HANDLER_URL"):
            if c.raw(name):
                c.problems.append(f"{name} is set but INGEST_ADDR is not: set INGEST_ADDR too")
        return settings
    if secret is None and not loopback(addr.host):
        c.problems.append(
            f"INGEST_TOKEN_SECRET is required: INGEST_ADDR {addr} is not a loopback address "
            "(127.0.0.1, ::1 or localhost); name a secret set with `relay secret set`"
        )
    if body < event_bytes:
        c.problems.append(f"INGEST_MAX_BODY_BYTES ({body}) is below MAX_EVENT_BYTES "
                          f"({event_bytes}): one event must fit a request")
    return settings


def loopback(host: str) -> bool:
    """Only this host can connect (an empty host is every interface)."""
    return host == "localhost" or host.startswith("127.") or host == "::1"


def parse_secret_name(value: str) -> str:
    if secret_name_error(value) is not None:
        raise ValueError(value)
    return value


def parse_body_bytes(value: str) -> int:
    number = _size(value)
    if not KIB <= number <= HARD_MAX_BODY_BYTES:
        raise ValueError(value)
    return number


def parse_http_url(value: str) -> str:
    """An ``http``/``https`` base URL with a host and nothing after it."""
    parts = urlsplit(value)
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError(value) from None
    bare = parts.path in ("", "/") and not parts.query and not parts.fragment
    if parts.scheme not in ("http", "https") or not parts.hostname or not bare:
        raise ValueError(value)
    if "@" in parts.netloc:  # credentials in a URL end up in every log of it
        raise ValueError(value)
    return value.rstrip("/")


_SECRET_ACCEPTS = "a secret name of lowercase letters, digits, '.', '_' and '-'"  # noqa: S105
_TEST_ONLY = "a positive duration (a test-only setting)"
_REDIS_VARIABLES = ("REDIS_URI", "REDIS_STREAM", "REDIS_GROUP")
_NO_BROKER = (
    "REDIS_URI is required: host:port, redis://[user:password@]host:port or rediss://..."
    " (with REDIS_STREAM and REDIS_GROUP); no broker is configured: to run without Redis,"
    " start on the embedded broker with `relay start --embedded` (RELAY_BROKER=sqlite)"
)
_REDIS_URI_ACCEPTS = "host:port, redis://[user:password@]host:port or rediss://..."
_ADDR_ACCEPTS = "a listen address host:port or :port, with a port from 1 to 65535"


class InvalidValue(ValueError):
    """A ``ValueError`` whose one argument is a reason safe to print beside the value."""


_QUERY_CREDENTIAL = re.compile(r"(?i)(^|&)((?:user(?:name)?|password)=)[^&]*")


def redact_uri(value: str) -> str:
    """``value`` with its credentials replaced by ``***``, for every message.

    Everything before the last ``@`` after the scheme is the userinfo (a password
    may hold an unescaped ``@``, ``/`` or ``#``: masking more than the host is
    safer than less), and the ``username``/``password`` query parameters redis-py
    also reads are masked too. Works on values that do not parse as a URL.
    """
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "", value
    _userinfo, at, rest = rest.rpartition("@")
    if at:
        rest = "***@" + rest
    base, question, query = rest.partition("?")
    if question:
        rest = base + "?" + _QUERY_CREDENTIAL.sub(r"\1\2***", query)
    return f"{scheme}{sep}{rest}"


def parse_redis_uri(value: str) -> str:
    """Return a URL redis-py understands: plain ``host:port`` becomes ``redis://host:port``.

    A URL is also parsed by redis-py itself, so a query parameter it would refuse
    at connect time (``?socket_timeout=abc``) is refused here, in one line.
    """
    if "://" in value:
        parts = urlsplit(value)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(value)
        if not parts.hostname:
            raise ValueError(value)
        try:
            port = parts.port
        except ValueError:
            raise ValueError(value) from None
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(value)
        # imported here: every admin command loads this module, few parse a URL
        from redis.connection import parse_url as redis_parse_url  # noqa: PLC0415

        try:
            redis_parse_url(value)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        except ValueError as exc:
            # redis-py's reasons name the parameter, never its value
            raise InvalidValue(str(exc).rstrip(".")) from None
        return value
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or any(ch in host for ch in "/@ "):
        raise ValueError(value)
    port = _port(port_text)
    return f"redis://{host}:{port}"


def parse_listen_address(value: str) -> ListenAddress:
    host, sep, port_text = value.rpartition(":")
    if not sep or " " in host:
        raise ValueError(value)
    return ListenAddress(host=host.strip("[]"), port=_port(port_text))


def parse_log_level(value: str) -> str:
    level = value.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(value)
    return level


def parse_log_format(value: str) -> str:
    log_format = value.strip().lower()
    if log_format not in LOG_FORMATS:
        raise ValueError(value)
    return log_format


def positive_int(value: str) -> int:
    text = value.strip()
    if not text.isdigit():
        raise ValueError(value)
    number = int(text)
    if number <= 0:
        raise ValueError(value)
    return number


def positive_duration(value: str) -> int:
    try:
        ns = parse_setting_duration(value)
    except DurationError:
        raise ValueError(value) from None
    if ns <= 0:
        raise ValueError(value)
    return ns


def non_negative_duration(value: str) -> int:
    try:
        ns = parse_setting_duration(value)
    except DurationError:
        raise ValueError(value) from None
    if ns < 0:
        raise ValueError(value)
    return ns


def parse_ledger_retention(value: str) -> int:
    """A duration of at least ``MIN_LEDGER_RETENTION_NS`` (why: relay.domain.invocation)."""
    ns = positive_duration(value)
    if ns < MIN_LEDGER_RETENTION_NS:
        raise ValueError(value)
    return ns


EVENT_BYTES_VARIABLE = "MAX_EVENT_BYTES"
EVENT_BYTES_ACCEPTS = "a size from 1 byte to 1MiB"


def load_max_event_bytes(env: Mapping[str, str]) -> int:
    """``MAX_EVENT_BYTES`` for the commands that check events as the worker will
    (``relay publish``, ``relay function match``): the same default and parser as
    :func:`load_settings`, one line (:class:`ConfigError`) when it is invalid."""
    raw = env.get(EVENT_BYTES_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_MAX_EVENT_BYTES
    try:
        return parse_event_bytes(raw)
    except ValueError:
        raise ConfigError(
            f"{EVENT_BYTES_VARIABLE}={raw[:40]!r} is invalid: {EVENT_BYTES_ACCEPTS}"
        ) from None


def parse_event_bytes(value: str) -> int:
    number = _size(value)
    if number > HARD_MAX_EVENT_BYTES:
        raise ValueError(value)
    return number


def _size(value: str) -> int:
    """Bytes, or with a KiB/MiB suffix."""
    text = value.strip()
    scale = 1
    for suffix, size in (("KiB", KIB), ("MiB", MIB)):
        if text.endswith(suffix):
            text, scale = text[: -len(suffix)].strip(), size
            break
    return positive_int(text) * scale


# Every TRAEFIK_* value reaches a Traefik label; none may carry rule syntax
# (backticks, parentheses, '|', '&') or a list separator (',') into it.
_TRAEFIK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_NAME_ACCEPTS = "a name of letters, digits, '_', '.' and '-'"


def parse_traefik_name(value: str) -> str:
    if not _TRAEFIK_NAME.fullmatch(value):
        raise ValueError(value)
    return value


def parse_traefik_names(value: str) -> tuple[str, ...]:
    return tuple(parse_traefik_name(name) for name in parse_list(value))


def parse_hostname(value: str) -> str:
    if hostname_problem(value) is not None:
        raise ValueError(value)
    return value


def parse_list(value: str) -> tuple[str, ...]:
    """Comma list: entries trimmed, empties dropped, duplicates removed, order kept."""
    seen: dict[str, None] = {}
    for item in value.split(","):
        entry = item.strip()
        if entry:
            seen.setdefault(entry, None)
    return tuple(seen)


def _port(text: str) -> int:
    if not text.isdigit():
        raise ValueError(text)
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(text)
    return port
