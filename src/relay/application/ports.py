"""Ports: the roles Relay's use cases need from the outside world.

Each is a ``typing.Protocol`` named for its role. Adapters are named technology +
role (``RedisEventStream``); in-memory fakes for unit tests live in
``tests/fakes.py`` as ``InMemory...``. Each area owns its section below.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import NamedTuple, Protocol

from relay.domain.execution import InvocationRequest, InvocationResult, PoolSnapshot
from relay.domain.functions import BuildTemplate, FunctionImage
from relay.domain.template import Template


# --- time and randomness ---------------------------------------------------------
class Clock(Protocol):
    """Wall-clock and monotonic time, injected so decisions are testable."""

    def now(self) -> float:
        """Seconds since the epoch (UTC)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a monotonic clock, for timeouts and ages."""
        ...


class TokenSource(Protocol):
    """Random fencing tokens and ids."""

    def token(self) -> str: ...


# --- event stream and invocation ledger (delivery) --------------------------------
# --- container runtime (execution) ------------------------------------------------
class ContainerRuntime(Protocol):
    """Warm, hardened execution containers, one pool per function and image version.

    Implemented by ``relay.adapters.docker.runtime.DockerContainerRuntime``.
    """

    def activate(self, function: str, image: str, runtime: str, capacity: int) -> None:
        """Make ``image`` the function's current version (an image change drains
        the old one) and set its pool capacity (resized live)."""
        ...

    def remove(self, function: str) -> None:
        """The function is gone: idle containers go now, busy ones on release."""
        ...

    async def invoke(self, request: InvocationRequest) -> InvocationResult:
        """Lease a warm container (created lazily up to capacity), run one
        request in it, then release or discard it. A handler failure is a
        result, not an exception; raises ``RuntimeUnavailable`` only when no
        container could serve the request (the handler never ran)."""
        ...

    def snapshot(self, function: str) -> PoolSnapshot | None:
        """Live gauges and cumulative counters; ``None`` for an unknown function."""
        ...

    async def aclose(self) -> None:
        """Discard every container (reason ``shutdown``)."""
        ...


# --- images and functions (lifecycle) ---------------------------------------------
class ImageBuilder(Protocol):
    """Builds, reuses and retires function images (``relay-fn-*``) and their
    shared dependency images (``relay-dep-*``).

    Implemented by ``relay.adapters.docker.images.DockerImageBuilder``.
    """

    async def prepare(
        self, function: str, directory: Path, template: BuildTemplate
    ) -> FunctionImage:
        """The image for the function's current source: reused without a build
        when its tag exists, else built (dependency image first). Raises
        ``BuildError`` (one line; ``output`` holds the capped build log)."""
        ...

    async def retire(self, function: str, keep: Collection[str]) -> list[str]:
        """Remove the function's images not in ``keep`` and not referenced by any
        container's ``relay.image`` label; then collect unreferenced dependency
        images. Returns the removed function image tags (or ids)."""
        ...

    async def collect_dependency_images(self) -> list[str]:
        """Remove ``relay-dep-*`` images no function image is built from."""
        ...


class DiscoveredFunction(NamedTuple):
    """A direct subdirectory of the functions directory (a candidate function)."""

    name: str
    directory: str
    has_template: bool


class FunctionSource(Protocol):
    """The functions directory, read only. Blocking: callers use worker threads.

    Implemented by ``relay.adapters.fs.discovery.FsFunctionSource``.
    """

    def scan(self) -> list[DiscoveredFunction]:
        """Every candidate function directory, sorted by name."""
        ...

    def directory_of(self, name: str) -> str:
        """Where function ``name`` lives (whether or not it exists)."""
        ...

    def load_template(self, directory: str) -> Template | None:
        """The directory's validated template; ``None`` when ``template.yaml`` is
        absent (or the directory is gone). Raises ``TemplateError``."""
        ...


# --- state view, stats and secrets -------------------------------------------------
class SecretStore(Protocol):
    """Named secret values. ``get`` raises ``SecretNotFound``."""

    def get(self, name: str) -> str: ...

    def names(self) -> list[str]: ...

    def set(self, name: str, value: str) -> None: ...

    def remove(self, name: str) -> None: ...


