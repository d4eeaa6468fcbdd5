"""What a prepared function is: the image that serves it and where it came from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec


class FunctionImage(msgspec.Struct, frozen=True, kw_only=True):
    """The image serving one version of a function.

    ``fingerprint`` is the full 64-hex SHA-256 of the selected source (the tag
    carries only its first 16 hex). ``dependency_image`` is the ``relay-dep-*``
    tag the image was built ``FROM`` (None only for images whose recipe has no
    dependency base). ``built`` is False when an existing image was reused.
    """

    function: str
    runtime: str
    fingerprint: str
    image: str
    dependency_image: str | None
    built: bool


class HandlerRef(Protocol):
    """Anything naming a handler as ``module.function`` (event and schedule rules)."""

    @property
    def handler(self) -> str: ...


class BuildTemplate(Protocol):
    """The parts of a function's template an image build reads.

    ``relay.domain.template.Template`` satisfies it; builds only need the
    runtime and the handler modules (to resolve and bundle TypeScript).
    """

    @property
    def runtime(self) -> str | None: ...

    @property
    def events(self) -> Sequence[HandlerRef]: ...

    @property
    def schedules(self) -> Sequence[HandlerRef]: ...


def handler_modules(template: BuildTemplate) -> tuple[str, ...]:
    """The distinct handler modules of a template, in first-seen order
    (``events.created.handler`` -> ``events.created``)."""
    seen: dict[str, None] = {}
    for rule in (*template.events, *template.schedules):
        module, _, _function = rule.handler.rpartition(".")
        if module:
            seen.setdefault(module, None)
    return tuple(seen)
