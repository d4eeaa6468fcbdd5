"""One error tree for Relay.

Every error a user can see derives from :class:`RelayError` and carries one clear
line of text. Adapters translate driver errors into these with ``raise ... from exc``
so the CLI and the daemon never show a traceback for a bad input or a missing
dependency.
"""

from __future__ import annotations


class RelayError(Exception):
    """Base of every error Relay raises on purpose."""


class ConfigError(RelayError):
    """An environment variable or command-line setting is invalid."""


class TemplateError(RelayError):
    """A ``template.yaml`` is invalid. ``problems`` lists every error found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class InvalidNameError(RelayError):
    """A function, secret or env var name does not follow the naming rules."""


class EventError(RelayError):
    """An event payload given by a user is not a JSON object."""


class DependencyUnavailable(RelayError):
    """Redis, Docker or the worker cannot be reached."""


class BuildError(RelayError):
    """An image could not be built; ``output`` keeps the (capped) build log."""

    def __init__(self, message: str, output: str = "") -> None:
        self.output = output
        super().__init__(message)
