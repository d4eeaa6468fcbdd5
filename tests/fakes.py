"""In-memory fakes of the ports, for unit tests. Fakes record what happened as
plain attributes; they are never mocks of Relay's own modules."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

import anyio
import anyio.lowlevel

from relay.domain.errors import BuildError
from relay.domain.execution import (
    InvocationRequest,
    InvocationResult,
    PoolSnapshot,
    RuntimeUnavailable,
    SecretNotFound,
)
from relay.domain.functions import BuildTemplate, FunctionImage


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self._now = now
        self._mono = 1000.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._mono += seconds


class SequentialTokens:
    """Predictable fencing tokens: t1, t2, ..."""

    def __init__(self) -> None:
        self._n = itertools.count(1)

    def token(self) -> str:
        return f"t{next(self._n)}"


# --- execution: secrets and the container runtime ------------------------------------
class InMemorySecretStore:
    """``SecretStore`` in a dict; ``reads`` records every name looked up."""

    def __init__(self, values: dict[str, str] | None = None) -> None:
        self.values: dict[str, str] = dict(values or {})
        self.reads: list[str] = []

    def get(self, name: str) -> str:
        self.reads.append(name)
        try:
            return self.values[name]
        except KeyError:
            raise SecretNotFound(f'secret "{name}" is not set') from None

    def names(self) -> list[str]:
        return sorted(self.values)

    def set(self, name: str, value: str) -> None:
        self.values[name] = value

    def remove(self, name: str) -> None:
        if self.values.pop(name, None) is None:
            raise SecretNotFound(f'secret "{name}" is not set')


ScriptedOutcome = (
    InvocationResult
    | Callable[[InvocationRequest], InvocationResult | Awaitable[InvocationResult]]
)


class InMemoryContainerRuntime:
    """``ContainerRuntime`` without containers.

    ``script`` maps ``"function/handler"`` to a ready ``InvocationResult`` or a
    callable ``(request) -> result`` (sync or async); unscripted handlers succeed.
    ``requests`` records every invocation, ``active`` the (image, runtime,
    capacity) per function, ``running``/``max_running`` concurrent invocations.
    """

    def __init__(self) -> None:
        self.script: dict[str, ScriptedOutcome] = {}
        self.requests: list[InvocationRequest] = []
        self.active: dict[str, tuple[str, str, int]] = {}
        self.removed: list[str] = []
        self.running = 0
        self.max_running = 0
        self.closed = False

    def activate(self, function: str, image: str, runtime: str, capacity: int) -> None:
        self.active[function] = (image, runtime, capacity)

    def remove(self, function: str) -> None:
        self.active.pop(function, None)
        self.removed.append(function)

    async def invoke(self, request: InvocationRequest) -> InvocationResult:
        if request.function not in self.active or self.closed:
            raise RuntimeUnavailable(f'function "{request.function}" is not active')
        self.requests.append(request)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await anyio.lowlevel.checkpoint()
            outcome = self.script.get(f"{request.function}/{request.handler}")
            if outcome is None:
                return InvocationResult(ok=True)
            if isinstance(outcome, InvocationResult):
                return outcome
            result = outcome(request)
            if isinstance(result, InvocationResult):
                return result
            return await result
        finally:
            self.running -= 1

    def snapshot(self, function: str) -> PoolSnapshot | None:
        if function not in self.active:
            return None
        capacity = self.active[function][2]
        return PoolSnapshot(
            capacity=capacity,
            containers=0,
            busy=0,
            idle=0,
            starting=0,
            warm_acquires=0,
            cold_starts=0,
            discarded=0,
        )

    async def aclose(self) -> None:
        self.closed = True


# --- lifecycle: images ----------------------------------------------------------------
class InMemoryImageBuilder:
    """``ImageBuilder`` without Docker.

    The fingerprint is a SHA-256 over the directory's files (paths and bytes); the
    image is ``relay-fn-<name>:<first 16 hex>``. ``images`` holds the existing
    images per function (an existing one is reused, ``built=False``). Set
    ``failures[name]`` to make that function's next prepares raise ``BuildError``;
    set ``gate`` to hold every prepare until the event is set. ``builds``,
    ``prepares``, ``retired`` (function, keep) and ``in_use`` (images a draining
    container still holds, never retired) record what happened.
    """

    def __init__(self) -> None:
        self.images: dict[str, set[str]] = {}
        self.failures: dict[str, str] = {}
        self.gate: anyio.Event | None = None
        self.builds: list[str] = []
        self.prepares: list[str] = []
        self.retired: list[tuple[str, tuple[str, ...]]] = []
        self.removed_images: list[str] = []
        self.in_use: set[str] = set()
        self.dependency_collections = 0

    async def prepare(
        self, function: str, directory: Path, template: BuildTemplate
    ) -> FunctionImage:
        self.prepares.append(function)
        if self.gate is not None:
            await self.gate.wait()
        if function in self.failures:
            raise BuildError(self.failures[function], output="step 3/5: exit status 1")
        fingerprint = _tree_fingerprint(directory)
        image = f"relay-fn-{function}:{fingerprint[:16]}"
        existing = self.images.setdefault(function, set())
        built = image not in existing
        if built:
            self.builds.append(image)
            existing.add(image)
        return FunctionImage(
            function=function,
            runtime=template.runtime or "",
            fingerprint=fingerprint,
            image=image,
            dependency_image=f"relay-dep-{template.runtime}:0123456789abcdef",
            built=built,
        )

    async def retire(self, function: str, keep: Collection[str]) -> list[str]:
        self.retired.append((function, tuple(keep)))
        images = self.images.get(function, set())
        gone = sorted(i for i in images if i not in keep and i not in self.in_use)
        images.difference_update(gone)
        self.removed_images.extend(gone)
        return gone

    async def collect_dependency_images(self) -> list[str]:
        self.dependency_collections += 1
        return []


def _tree_fingerprint(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


class InMemorySlots:
    """The reconciler's view of ``Slots``: records each function's requested limit."""

    def __init__(self, max_concurrency: int = 8) -> None:
        self.max_concurrency = max_concurrency
        self.limits: dict[str, int] = {}
        self.forgotten: list[str] = []

    def effective(self, capacity: int) -> int:
        return max(1, min(capacity, self.max_concurrency))

    def resize(self, function: str, capacity: int) -> None:
        self.limits[function] = self.effective(capacity)

    def forget(self, function: str) -> None:
        self.limits.pop(function, None)
        self.forgotten.append(function)
