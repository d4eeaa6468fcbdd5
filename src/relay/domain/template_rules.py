"""Field-level validation rules behind :func:`relay.domain.template.parse_template`.

Each helper appends located problems (``events[1].timeout: must be at most 5m``) to a
shared list and returns the validated value, or ``None`` when it is invalid, so one pass
reports every mistake of a template.
"""

from __future__ import annotations

import difflib
import keyword
import re
from collections.abc import Hashable, Iterator, Mapping
from datetime import date
from typing import Any, Final, Literal, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from relay.domain.durations import DurationError, format_duration, parse_duration
from relay.domain.errors import TemplateError
from relay.domain.names import RESERVED_ENV_NAMES, is_valid_env_name, secret_name_error
from relay.domain.patterns import CompiledPattern, compile_pattern, show

MISSING: Final = object()
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NODE_MODULE_PART = re.compile(r"[A-Za-z0-9_$][A-Za-z0-9_$-]*")
K = TypeVar("K", bound=Hashable)


def kind_of(value: object) -> str:
    """A short description of a value for messages: ``null``, ``a list``, ``"abc"``, ``12``."""
    if value is None:
        return "null"
    if isinstance(value, date):  # YAML reads an unquoted 2026-09-12 as a date
        return f"the YAML timestamp {value.isoformat()}; quote it for text"
    if isinstance(value, Mapping):
        return "a map"
    if isinstance(value, list | tuple):
        return "a list"
    return show(value, limit=40)


def at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def check_keys(
    item: Mapping[Any, Any], allowed: tuple[str, ...], where: str, problems: list[str]
) -> None:
    """Unknown keys are errors: a typo such as ``event:`` must not silently do nothing."""
    for key in item:
        if key in allowed:
            continue
        if not isinstance(key, str):
            problems.append(f"{at(where, show(key))}: unknown key (keys must be strings)")
            continue
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        hint = f'did you mean "{close[0]}"? ' if close else ""
        problems.append(f"{at(where, key)}: unknown key ({hint}allowed: {', '.join(allowed)})")


def entries(
    raw: object, section: str, problems: list[str]
) -> Iterator[tuple[int, Mapping[Any, Any]]]:
    """The maps of a list section (``events``, ``schedules``, ``services``); null is empty."""
    if raw is None:
        return
    if not isinstance(raw, list):
        problems.append(f"{section}: must be a list (got {kind_of(raw)})")
        return
    for i, item in enumerate(raw):
        if isinstance(item, Mapping):
            yield i, item
        else:
            problems.append(f"{section}[{i}]: must be a map (got {kind_of(item)})")


def unique(  # noqa: PLR0917  # a private helper; positional reads best at the call sites
    value: K,
    index: int,
    seen: dict[K, int],
    where: str,
    section: str,
    problems: list[str],
    what: str = "handler",
) -> None:
    if value in seen:
        parts = value if isinstance(value, tuple) else (value,)
        shown = " ".join(show(v) for v in parts if v is not None)
        problems.append(f"{where}: duplicate {what} {shown} (also {section}[{seen[value]}])")
    else:
        seen[value] = index


def runtime(data: Mapping[Any, Any], supported: tuple[str, ...], problems: list[str]) -> str | None:
    """``runtime``: validated whenever present; whether it is required is decided later."""
    value = data.get("runtime", MISSING)
    if value is MISSING:
        return None
    if isinstance(value, str) and value in supported:
        return value
    problems.append(f"runtime: {kind_of(value)} is not supported (use {' or '.join(supported)})")
    return None


def _integer(value: object) -> int | None:
    # bools are ints in Python and floats like 2.0 are not integers in a template
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def positive_int(value: object, where: str, default: int, problems: list[str]) -> int:
    if value is MISSING:
        return default
    number = _integer(value)
    if number is None or number <= 0:
        problems.append(f"{where}: must be a positive integer (got {kind_of(value)})")
        return default
    return number


def int_in_range(  # noqa: PLR0917  # a private helper; positional reads best at the call sites
    value: object, where: str, default: int, low: int, high: int, problems: list[str]
) -> int | None:
    if value is MISSING:
        return default
    number = _integer(value)
    if number is None or not low <= number <= high:
        problems.append(f"{where}: must be an integer from {low} to {high} (got {kind_of(value)})")
        return None
    return number


def handler(
    item: Mapping[Any, Any], where: str, runtime_name: str | None, problems: list[str]
) -> str | None:
    """``module.function``, split at the last dot; the module may be nested (``a.b.c``)."""
    here = f"{where}.handler"
    value = item.get("handler", MISSING)
    if value is MISSING:
        problems.append(f"{here}: is required (module.function, e.g. events.created.handler)")
        return None
    problem = handler_problem(value, runtime_name)
    if problem is not None:
        problems.append(f"{here}: {problem}")
        return None
    assert isinstance(value, str)
    return value


def handler_problem(  # noqa: PLR0911  # one early return per rule reads best
    value: object, runtime_name: str | None
) -> str | None:
    """Why ``value`` is not a valid ``module.function`` handler, or ``None``."""
    if not isinstance(value, str) or not value:
        return f"must be a module.function string (got {kind_of(value)})"
    if any(ch.isspace() for ch in value):
        return f"{show(value)} must not contain whitespace"
    module, dot, function = value.rpartition(".")
    if not dot or not module or not function:
        return f"{show(value)} must be module.function, e.g. events.created.handler"
    if _IDENT.fullmatch(function) is None:
        return f"{show(value)}: function {show(function)} is not a valid identifier"
    python = runtime_name == "python3.14"
    if python and keyword.iskeyword(function):
        return f"{show(value)}: function {show(function)} is a Python keyword"
    for part in module.split("."):
        if python and not is_python_identifier(part):
            return f"{show(value)}: module part {show(part)} is not a valid Python identifier"
        if not python and _NODE_MODULE_PART.fullmatch(part) is None:
            return f"{show(value)}: module part {show(part)} is not a valid module name"
    return None


def is_python_identifier(text: str) -> bool:
    """ASCII identifier that is not a keyword (``import a.class`` cannot work)."""
    return _IDENT.fullmatch(text) is not None and not keyword.iskeyword(text)


def python_entrypoint_problem(path: str) -> str | None:
    """Python services run ``python -m <module>``: ``app/main.py`` -> ``app.main``."""
    stem = path.removeprefix("./")
    if not stem.endswith(".py"):
        # The spec's own template example pairs python3.14 with `entrypoint: service.js`,
        # so other files are accepted here; only a .py path that cannot be a module fails.
        return None
    parts = stem.removesuffix(".py").split("/")
    if not all(is_python_identifier(part) for part in parts):
        module = ".".join(parts)
        return (
            f"cannot run as python -m {module}: directory and file names must be Python identifiers"
        )
    return None


def pattern(item: Mapping[Any, Any], where: str, problems: list[str]) -> CompiledPattern | None:
    value = item.get("pattern", MISSING)
    if value is MISSING or value is None:
        problems.append(f"{where}.pattern: is required (a map of field conditions)")
        return None
    try:
        return compile_pattern(value, f"{where}.pattern")
    except TemplateError as exc:
        problems.extend(exc.problems)
        return None


def timeout(
    value: object, where: str, maximum: int, default: int, problems: list[str]
) -> int | None:
    """A Go duration string, positive and at most ``maximum``."""
    if value is MISSING:
        return default
    if not isinstance(value, str):
        problems.append(
            f'{where}: must be a Go duration string such as "20s" (got {kind_of(value)})'
        )
        return None
    try:
        ns = parse_duration(value)
    except DurationError:
        problems.append(f"{where}: {show(value)} is not a Go duration (examples: 20s, 1m30s)")
        return None
    if ns <= 0:
        problems.append(f"{where}: must be positive (got {show(value)})")
        return None
    if ns > maximum:
        problems.append(f"{where}: must be at most {format_duration(maximum)} (got {show(value)})")
        return None
    return ns


def retries(value: object, where: str, default: int, problems: list[str]) -> int | None:
    if value is MISSING:
        return default
    number = _integer(value)
    if number is None or number < 0:
        problems.append(f"{where}: must be a non-negative integer (got {kind_of(value)})")
        return None
    return number


def cron(value: object, where: str, problems: list[str]) -> str | None:
    """5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first."""
    if value is MISSING:
        problems.append(f'{where}: is required (e.g. "0 3 * * *")')
        return None
    if not isinstance(value, str):
        problems.append(
            f'{where}: must be a cron string such as "0 3 * * *" (got {kind_of(value)})'
        )
        return None
    fields = value.split()
    if len(fields) not in (5, 6):
        problems.append(
            f"{where}: {show(value)} must have 5 fields (minute hour day-of-month month "
            f"day-of-week) or 6 (second first), not {len(fields)}"
        )
        return None
    try:
        croniter(value, 0, second_at_beginning=len(fields) == 6).get_next(float)
    except CroniterError as exc:
        reason = "never fires" if "next date" in str(exc) else "is not a valid cron expression"
        problems.append(f"{where}: {show(value)} {reason}")
        return None
    except (KeyError, TypeError, IndexError, OverflowError):
        problems.append(f"{where}: {show(value)} is not a valid cron expression")
        return None
    return value


def timezone(value: object, where: str, problems: list[str]) -> str | None:
    """An IANA zone name; omitted means UTC."""
    if value is MISSING:
        return "UTC"
    if not isinstance(value, str) or not value:
        problems.append(
            f'{where}: must be an IANA timezone such as "Europe/Rome" (got {kind_of(value)})'
        )
        return None
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        problems.append(f"{where}: {show(value)} is not a known IANA timezone (e.g. Europe/Rome)")
        return None
    return value


def catchup(value: object, where: str, maximum: int, problems: list[str]) -> int | None:
    """A Go duration, ``0`` (the default) meaning off, at most ``maximum``."""
    if value is MISSING or value in ("0", 0):
        return 0
    return timeout(value, where, maximum, 0, problems)


def overlap(value: object, where: str, problems: list[str]) -> Literal["allow", "skip"] | None:
    """``allow`` (the default) or ``skip``."""
    if value is MISSING or value == "allow":
        return "allow"
    if value == "skip":
        return "skip"
    problems.append(f"{where}: must be allow or skip (got {kind_of(value)})")
    return None


def env_and_secrets(
    env_raw: object, secrets_raw: object, problems: list[str]
) -> tuple[dict[str, str], dict[str, str]]:
    env = _variables(env_raw, "env", _env_value, problems)
    secrets = _variables(secrets_raw, "secrets", _secret_value, problems)
    env_names = set(env_raw) if isinstance(env_raw, Mapping) else set()
    secret_names = list(secrets_raw) if isinstance(secrets_raw, Mapping) else []
    for name in secret_names:
        if name in env_names and isinstance(name, str):
            problems.append(f"secrets.{name}: is also set in env; define a variable in one place")
    return env, secrets


def _variables(raw: object, section: str, check: Any, problems: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    if raw is None:
        return out
    if not isinstance(raw, Mapping):
        problems.append(f"{section}: must be a map of NAME: value (got {kind_of(raw)})")
        return out
    for name, value in raw.items():
        if not isinstance(name, str) or not is_valid_env_name(name):
            problems.append(
                f"{section}: {show(name)} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )
            continue
        if name in RESERVED_ENV_NAMES:
            problems.append(f"{section}.{name}: is reserved by Relay")
            continue
        checked = check(value, f"{section}.{name}", problems)
        if checked is not None:
            out[name] = checked
    return out


def _env_value(value: object, where: str, problems: list[str]) -> str | None:
    if value is None:  # `FLAG:` with nothing after it: an empty, flag-like value
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        problems.append(
            f"{where}: value must be a string, but YAML read the boolean "
            f"{_yaml_text(value)} (from an unquoted yes/no/on/off/true/false); put it in quotes"
        )
        return None
    if isinstance(value, int | float):
        problems.append(
            f"{where}: value must be a string, but YAML read the number {_yaml_text(value)}; "
            f'put it in quotes: "{_yaml_text(value)}"'
        )
        return None
    problems.append(f"{where}: value must be a string (got {kind_of(value)})")
    return None


def _yaml_text(value: bool | int | float) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _secret_value(value: object, where: str, problems: list[str]) -> str | None:
    if not isinstance(value, str):
        problems.append(f"{where}: must be a secret name (got {kind_of(value)})")
        return None
    error = secret_name_error(value)  # never the value: it may be the secret itself
    if error is not None:
        problems.append(f"{where}: {error}")
        return None
    return value
