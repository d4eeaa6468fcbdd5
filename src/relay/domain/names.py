"""Naming rules for functions, secrets and environment variables.

Names are validated, never sanitized: a name that passes is already safe to use as a
Docker image tag (functions), a file name (secrets) or a POSIX environment variable.
"""

from __future__ import annotations

import re

from relay.domain.errors import InvalidNameError
from relay.domain.handler_context import CONTEXT_ENV_NAMES

MAX_FUNCTION_NAME = 63
MAX_SECRET_NAME = 63
RESERVED_ENV_NAMES = CONTEXT_ENV_NAMES  # RELAY_HANDLER and the invocation context

_FUNCTION_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_SECRET_NAME = re.compile(r"[a-z0-9._-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# One path component of a Docker image reference (distribution/reference grammar).
DOCKER_NAME_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")


def function_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid function name, or ``None`` when it is."""
    if not name:
        return "must not be empty"
    if len(name) > MAX_FUNCTION_NAME:
        return f"must be at most {MAX_FUNCTION_NAME} characters (has {len(name)})"
    if _FUNCTION_NAME.fullmatch(name) is None:
        return (
            "must start with a lowercase letter or digit and contain only "
            "lowercase letters, digits, '.', '_' and '-'"
        )
    if name.endswith("."):
        return "must not end with a dot"
    if DOCKER_NAME_COMPONENT.fullmatch(name) is None:
        # The spec's rule alone lets through names Docker refuses as an image
        # repository (`abc-`, `a..b`); they could never be built, so say so here.
        return (
            "must end with a letter or digit, and '.', '_', '__' or '-' may only "
            "separate letters and digits (it names the function's Docker image)"
        )
    return None


def secret_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid secret name, or ``None`` when it is."""
    if not name:
        return "must not be empty"
    if len(name) > MAX_SECRET_NAME:
        return f"must be at most {MAX_SECRET_NAME} characters (has {len(name)})"
    if _SECRET_NAME.fullmatch(name) is None:
        return "may contain only lowercase letters, digits, '.', '_' and '-'"
    if name.startswith(".") or name.endswith("."):
        return "must not start or end with a dot"
    return None


def secret_name_error(name: str) -> str | None:
    """The error line for an invalid secret name, or ``None`` when it is valid.

    The name itself is never shown, only its length: what gets pasted where a
    secret's name belongs is, often enough, the secret (a connection URL, a token)."""
    problem = secret_name_problem(name)
    if problem is None:
        return None
    return f"invalid secret name ({_characters(len(name))}, not shown): {problem}"


def _characters(count: int) -> str:
    return "1 character" if count == 1 else f"{count} characters"


def validate_secret_name(name: str) -> None:
    error = secret_name_error(name)
    if error is not None:
        raise InvalidNameError(error)


def is_valid_env_name(name: str) -> bool:
    """Environment variable names: ``[A-Za-z_][A-Za-z0-9_]*``."""
    return _ENV_NAME.fullmatch(name) is not None


# A DNS label: ASCII letters and digits, inner hyphens, 63 characters at most.
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def hostname_problem(value: str) -> str | None:
    """Why ``value`` is not a DNS hostname (dot-separated labels of ASCII letters,
    digits and inner '-', 253 characters at most), or ``None``. The one rule for
    every host that reaches a Traefik ``Host(`...`)`` rule."""
    labels = value.split(".")
    if len(value) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return "is not a valid hostname (e.g. api.example.com)"
    return None
