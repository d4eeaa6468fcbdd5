"""Validation rules for a template's ``services`` entries (see ``template_rules``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from relay.domain.names import hostname_problem
from relay.domain.patterns import show
from relay.domain.template_rules import (
    MISSING,
    int_in_range,
    kind_of,
    positive_int,
    python_entrypoint_problem,
)

# RFC 3986 ``pchar`` without the sub-delims Traefik's rule language or its
# comma-separated label lists give a meaning to: "(", ")", "&" and ",". Backticks,
# quotes, "|", whitespace and every non-ASCII character are not pchar at all. "%"
# is allowed only as a pct-encoding ``%XX``.
_PATH_CHAR = re.compile(r"[A-Za-z0-9\-._~!$'*+;=:@/]")
_PCT_ENCODED = re.compile(r"%[0-9A-Fa-f]{2}")
PATH_CHARS_ACCEPTED = (
    "letters, digits, '/', '-', '.', '_', '~', '!', '$', \"'\", '*', '+', ';', '=', ':', "
    "'@' and %XX"
)
MAX_REPLICAS = 100
"""One worker runs every replica on its own Docker engine, so a count beyond what one
host serves is a typo (``replicas: 1000000000000``); at 100 one convergence plan takes
about 1.4 ms on the event loop, every replica routed and stale (the costliest case,
measured on a loaded 2-core machine; tests/unit/test_service_rules.py bounds it)."""
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REF = re.compile(
    r"(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?/)?"
    rf"{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
ServiceKind = Literal["entrypoint", "build", "image"]
ServiceFields = tuple[ServiceKind, str, int, int, str | None, str | None]


def service(  # noqa: PLR0917  # a private helper; positional reads best at the call site
    item: Mapping[Any, Any],
    runtime_name: str | None,
    where: str,
    default_port: int,
    default_replicas: int,
    problems: list[str],
) -> ServiceFields | None:
    before = len(problems)
    kinds = [k for k in ("entrypoint", "build", "image") if k in item]
    if len(kinds) != 1:
        found = f"has {' and '.join(kinds)}" if kinds else "has none"
        problems.append(f"{where}: needs exactly one of entrypoint, build or image ({found})")
        return None
    kind: Literal["entrypoint", "build", "image"] = kinds[0]  # type: ignore[assignment]
    source = _source(kind, item[kind], f"{where}.{kind}", problems)
    if source is not None and kind == "entrypoint" and runtime_name == "python3.14":
        problem = python_entrypoint_problem(source)
        if problem is not None:
            problems.append(f"{where}.entrypoint: {show(source)} {problem}")
    port = int_in_range(
        item.get("port", MISSING), f"{where}.port", default_port, 1, 65535, problems
    )
    replicas = _replicas(item.get("replicas", MISSING), f"{where}.replicas", default_replicas,
                         problems)
    named = f"service {show(source) if source is not None else '?'}: "
    host = _host(item.get("host"), f"{where}.host: {named}", problems)
    path = _path(item.get("path"), f"{where}.path: {named}", problems)
    if path is not None and item.get("host") in (None, ""):
        shown = show(source) if source is not None else "?"
        problems.append(f"{where}: service {shown}: path requires host")
    if len(problems) != before or source is None or port is None:
        return None
    return kind, source, port, replicas, host, path


def _replicas(value: object, where: str, default: int, problems: list[str]) -> int:
    before = len(problems)
    replicas = positive_int(value, where, default, problems)
    if len(problems) == before and replicas > MAX_REPLICAS:
        problems.append(f"{where}: {replicas} is over the limit of {MAX_REPLICAS} replicas "
                        "per service")
        return default
    return replicas


def _source(kind: str, value: object, where: str, problems: list[str]) -> str | None:
    if not isinstance(value, str) or not value:
        problems.append(f"{where}: must be a non-empty string (got {kind_of(value)})")
        return None
    if kind == "image":
        if _IMAGE_REF.fullmatch(value) is None:
            problems.append(f"{where}: {show(value)} is not a valid image reference")
            return None
        return value
    problem = relative_path_problem(value)
    if problem is not None:
        problems.append(f"{where}: {show(value)} {problem}")
        return None
    return value


def relative_path_problem(value: str) -> str | None:
    if any(ch.isspace() for ch in value):
        return "must not contain whitespace"
    if value.startswith("/") or "\\" in value:
        return "must be a relative path with forward slashes (inside the function directory)"
    if ".." in value.split("/"):
        return "must not contain '..' path elements"
    if value.endswith("/"):
        return "must name a file, not a directory"
    return None


def _host(value: object, where: str, problems: list[str]) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        problems.append(
            f"{where}must be a hostname such as api.example.com (got {kind_of(value)})"
        )
        return None
    problem = hostname_problem(value)
    if problem is not None:
        problems.append(f"{where}{show(value)} {problem}")
        return None
    return value


def path_character_problem(value: str) -> str | None:
    """The first character of ``value`` that is not a URL path character (see
    ``_PATH_CHAR``), named in one line, or ``None``: what keeps a ``path`` from
    closing the backtick-quoted ``PathPrefix`` and adding its own rule."""
    i = 0
    while i < len(value):
        if value[i] == "%" and _PCT_ENCODED.match(value, i):
            i += 3
            continue
        if not _PATH_CHAR.fullmatch(value[i]):
            shown = f"'{value[i]}'" if value[i].isprintable() else f"U+{ord(value[i]):04X}"
            return (f"contains {shown} at offset {i}: only {PATH_CHARS_ACCEPTED} "
                    "are allowed in a URL path")
        i += 1
    return None


def _path(value: object, where: str, problems: list[str]) -> str | None:
    """A URL path prefix; trailing slashes are trimmed except for the root ``/``."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        problems.append(f"{where}must be a URL path such as /v2 (got {kind_of(value)})")
        return None
    problem = None
    if not value.startswith("/"):
        problem = "must start with /"
    elif any(ch.isspace() for ch in value):
        problem = "must not contain whitespace"
    elif "?" in value or "#" in value:
        problem = "must not contain a query (?) or a fragment (#)"
    elif "\\" in value:
        problem = "must not contain a backslash"
    elif "//" in value:
        problem = "must not contain an empty segment (//)"
    else:
        problem = path_character_problem(value)
    if problem is not None:
        problems.append(f"{where}{show(value)} {problem}")
        return None
    trimmed = value.rstrip("/")
    return trimmed or "/"
