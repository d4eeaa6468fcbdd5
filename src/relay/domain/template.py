"""The ``template.yaml`` model and its validation.

:func:`parse_template` takes the already-decoded YAML document (plain dicts, lists and
scalars; the YAML parsing itself lives in ``relay.adapters.fs.templates``) and either
returns a :class:`Template` or raises :class:`TemplateError` listing EVERY problem, each
prefixed by its location (``events[1].timeout: must be at most 5m``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from relay.domain import template_rules as rules
from relay.domain import template_services
from relay.domain.breaker import BreakerPolicy
from relay.domain.durations import HOUR, MINUTE, SECOND
from relay.domain.errors import TemplateError
from relay.domain.patterns import CompiledPattern
from relay.domain.template_breaker import breaker as breaker_policy

MAX_TIMEOUT_NS = 5 * MINUTE
DEFAULT_TIMEOUT_NS = 6 * SECOND
DEFAULT_RETRIES = 4
DEFAULT_CONCURRENCY = 2
DEFAULT_PORT = 80
DEFAULT_REPLICAS = 1
SUPPORTED_RUNTIMES = ("python3.14", "node24")
TOP_LEVEL_KEYS = (
    "runtime", "concurrency", "events", "schedules", "env", "secrets", "services", "breaker",
)

EVENT_KEYS = ("handler", "pattern", "timeout", "retries")
SCHEDULE_KEYS = ("handler", "cron", "timezone", "timeout", "retries", "catchup", "overlap")
SERVICE_KINDS = ("entrypoint", "build", "image")
SERVICE_KEYS = (*SERVICE_KINDS, "port", "replicas", "host", "path")

ServiceKind = Literal["entrypoint", "build", "image"]
Overlap = Literal["allow", "skip"]
MAX_CATCHUP_NS = 24 * HOUR


class HandlerRule(msgspec.Struct, frozen=True, kw_only=True):
    """What event and schedule rules share: the ``module.function`` they run."""

    handler: str
    timeout_ns: int = DEFAULT_TIMEOUT_NS
    retries: int = DEFAULT_RETRIES

    @property
    def module(self) -> str:
        return self.handler.rpartition(".")[0]

    @property
    def function(self) -> str:
        return self.handler.rpartition(".")[2]


class EventRule(HandlerRule, frozen=True, kw_only=True):
    """One ``events`` entry: run ``handler`` for events matching ``pattern``."""

    pattern: CompiledPattern
    raw_pattern: dict[str, Any] = msgspec.field(default_factory=dict)


class ScheduleRule(HandlerRule, frozen=True, kw_only=True):
    """One ``schedules`` entry: run ``handler`` at every ``cron`` occurrence in ``timezone``."""

    cron: str
    timezone: str = "UTC"
    catchup_ns: int = 0  # 0 = off: missed occurrences are not published at start
    overlap: Overlap = "allow"

    @property
    def has_seconds(self) -> bool:
        """Whether ``cron`` is the 6-field form whose first field is the second."""
        return len(self.cron.split()) == 6


class ServiceSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One ``services`` entry. ``source`` (the entrypoint file, Dockerfile path or
    image reference) is the service's identity within its function."""

    kind: ServiceKind
    source: str
    port: int = DEFAULT_PORT
    replicas: int = DEFAULT_REPLICAS
    host: str | None = None
    path: str | None = None

    @property
    def identity(self) -> str:
        return self.source

    @property
    def python_module(self) -> str:
        """The module an entrypoint runs as on Python: ``app/main.py`` -> ``app.main``."""
        return self.source.removeprefix("./").removesuffix(".py").replace("/", ".")

    @property
    def display(self) -> str:
        """``service.js`` for an entrypoint, ``build:Dockerfile``, ``image:nginx:1.27``."""
        return self.source if self.kind == "entrypoint" else f"{self.kind}:{self.source}"


class Template(msgspec.Struct, frozen=True, kw_only=True):
    """A validated ``template.yaml``."""

    runtime: str | None = None
    concurrency: int = DEFAULT_CONCURRENCY
    events: tuple[EventRule, ...] = ()
    schedules: tuple[ScheduleRule, ...] = ()
    env: dict[str, str] = msgspec.field(default_factory=dict)
    secrets: dict[str, str] = msgspec.field(default_factory=dict)
    services: tuple[ServiceSpec, ...] = ()
    breaker: BreakerPolicy | None = None  # off by default

    @property
    def needs_runtime(self) -> bool:
        return bool(self.events or self.schedules) or any(
            s.kind == "entrypoint" for s in self.services
        )


def parse_template(data: object) -> Template:
    """Validate a decoded template document; raise :class:`TemplateError` with every problem."""
    problems: list[str] = []
    if data is None:
        raise TemplateError(["template: is empty (it needs at least a runtime and events)"])
    if not isinstance(data, Mapping):
        raise TemplateError([f"template: must be a map of settings (got {rules.kind_of(data)})"])
    rules.check_keys(data, TOP_LEVEL_KEYS, "", problems)
    runtime = rules.runtime(data, SUPPORTED_RUNTIMES, problems)
    concurrency = rules.positive_int(
        data.get("concurrency", rules.MISSING), "concurrency", DEFAULT_CONCURRENCY, problems
    )
    events = _events(data.get("events"), runtime, problems)
    schedules = _schedules(data.get("schedules"), runtime, problems)
    env, secrets = rules.env_and_secrets(data.get("env"), data.get("secrets"), problems)
    services = _services(data.get("services"), runtime, problems)
    breaker = breaker_policy(data.get("breaker", rules.MISSING), problems)
    template = Template(
        runtime=runtime,
        concurrency=concurrency,
        events=events,
        schedules=schedules,
        env=env,
        secrets=secrets,
        services=services,
        breaker=breaker,
    )
    if "runtime" not in data and _needs_runtime(data):
        problems.append(
            "runtime: is required when the template has events, schedules or an entrypoint "
            f"service (one of {', '.join(SUPPORTED_RUNTIMES)})"
        )
    if problems:
        raise TemplateError(problems)
    return template


def _needs_runtime(data: Mapping[Any, Any]) -> bool:
    # from the raw document, so an invalid event rule still reports the missing runtime
    services = data.get("services")
    entrypoint = isinstance(services, list) and any(
        isinstance(s, Mapping) and "entrypoint" in s for s in services
    )
    return bool(data.get("events")) or bool(data.get("schedules")) or entrypoint


def _events(raw: object, runtime: str | None, problems: list[str]) -> tuple[EventRule, ...]:
    out: list[EventRule] = []
    seen: dict[str, int] = {}
    for i, item in rules.entries(raw, "events", problems):
        where = f"events[{i}]"
        rules.check_keys(item, EVENT_KEYS, where, problems)
        handler = rules.handler(item, where, runtime, problems)
        pattern = rules.pattern(item, where, problems)
        timeout, retries = _limits(item, where, problems)
        if handler is not None:
            rules.unique(handler, i, seen, f"{where}.handler", "events", problems)
        if handler is None or pattern is None or timeout is None or retries is None:
            continue
        raw_pattern = dict(item["pattern"])
        out.append(
            EventRule(
                handler=handler,
                pattern=pattern,
                timeout_ns=timeout,
                retries=retries,
                raw_pattern=raw_pattern,
            )
        )
    return tuple(out)


def _limits(
    item: Mapping[str, object], where: str, problems: list[str]
) -> tuple[int | None, int | None]:
    """A rule's ``timeout`` and ``retries`` (same rules for events and schedules)."""
    timeout = rules.timeout(
        item.get("timeout", rules.MISSING),
        f"{where}.timeout",
        MAX_TIMEOUT_NS,
        DEFAULT_TIMEOUT_NS,
        problems,
    )
    retries = rules.retries(
        item.get("retries", rules.MISSING), f"{where}.retries", DEFAULT_RETRIES, problems
    )
    return timeout, retries


def _schedules(raw: object, runtime: str | None, problems: list[str]) -> tuple[ScheduleRule, ...]:
    out: list[ScheduleRule] = []
    seen: dict[str, int] = {}
    for i, item in rules.entries(raw, "schedules", problems):
        where = f"schedules[{i}]"
        rules.check_keys(item, SCHEDULE_KEYS, where, problems)
        handler = rules.handler(item, where, runtime, problems)
        cron = rules.cron(item.get("cron", rules.MISSING), f"{where}.cron", problems)
        zone = rules.timezone(item.get("timezone", rules.MISSING), f"{where}.timezone", problems)
        timeout, retries = _limits(item, where, problems)
        catchup = rules.catchup(item.get("catchup", rules.MISSING), f"{where}.catchup",
                                MAX_CATCHUP_NS, problems)
        overlap = rules.overlap(item.get("overlap", rules.MISSING), f"{where}.overlap", problems)
        if handler is not None:
            rules.unique(handler, i, seen, f"{where}.handler", "schedules", problems)
        if (
            handler is None or cron is None or zone is None or timeout is None
            or retries is None or catchup is None or overlap is None
        ):  # fmt: skip
            continue
        out.append(
            ScheduleRule(
                handler=handler, cron=cron, timezone=zone, timeout_ns=timeout, retries=retries,
                catchup_ns=catchup, overlap=overlap,
            )
        )
    return tuple(out)


def _services(raw: object, runtime: str | None, problems: list[str]) -> tuple[ServiceSpec, ...]:
    out: list[ServiceSpec] = []
    seen_source: dict[str, int] = {}
    seen_route: dict[tuple[str, str | None], int] = {}
    for i, item in rules.entries(raw, "services", problems):
        where = f"services[{i}]"
        rules.check_keys(item, SERVICE_KEYS, where, problems)
        service = template_services.service(
            item, runtime, where, DEFAULT_PORT, DEFAULT_REPLICAS, problems
        )
        if service is None:
            continue
        kind, source, port, replicas, host, path = service
        rules.unique(source, i, seen_source, where, "services", problems, what="source")
        if host is not None:
            route = (host.lower(), path)
            rules.unique(
                route, i, seen_route, f"{where}.host", "services", problems, what="host and path"
            )
        out.append(
            ServiceSpec(
                kind=kind, source=source, port=port, replicas=replicas, host=host, path=path
            )
        )
    return tuple(out)
