"""``DockerImageBuilder``: function and dependency images on the Docker engine.

``prepare`` reads the selected source once; that one read drives the
fingerprint, the tag and the build context, so all three always agree. An
existing tag is reused without a build when it was made by the same recipe
(the ``relay.build`` label: the rendered Dockerfile plus the bootstrap bytes),
so a new bootstrap or a new pinned tool rebuilds even when the source did not
change; the rebuilt image takes over the tag and the old one, now untagged, is
collected by ``retire`` once no container uses it.

Every intermediate image of a build carries a stage label (``relay.type`` =
``function-stage`` / ``dependency-stage``), so what a failed build leaves behind
is Relay's to collect. Cleanup lives in ``relay.adapters.docker.image_cleanup``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiodocker
import anyio
import msgspec
import structlog
from aiodocker.exceptions import DockerError

from relay.adapters.docker.bootstraps import BOOTSTRAP_VERSION, bootstrap_command, bootstrap_source
from relay.adapters.docker.build_output import (
    OUTPUT_CAP_BYTES,
    CappedOutput,
    stream_build,
    summarize_failure,
)
from relay.adapters.docker.dockerfiles import (
    app_files,
    dependency_context,
    function_context,
    render_dependency_dockerfile,
    render_function_dockerfile,
)
from relay.adapters.docker.image_cleanup import (
    BuildsInFlight,
    DockerImageCleaner,
    labels_of,
    normal,
)
from relay.adapters.docker.runtimes import RUNTIMES, DependencyPlan, Runtime
from relay.adapters.fs.source import read_sources, select_sources
from relay.domain.errors import BuildError, DependencyUnavailable
from relay.domain.functions import BuildTemplate, FunctionImage, handler_modules
from relay.domain.source import fingerprint, image_tag

log = structlog.get_logger(__name__)

DEPENDENCY_TAG_HEX = 16
_NOT_FOUND = 404
_CONFLICT = 409
# The engine's /version says GOARCH; image versions were hashed with uname -m names.
_UNAME_ARCH = {"amd64": "x86_64", "arm64": "aarch64", "386": "i686", "arm": "armv7l"}


@dataclass(frozen=True)
class _Plan:
    """One function version's build, fully decided."""

    image: FunctionImage
    runtime: Runtime
    dependencies: DependencyPlan
    dependency_tag: str
    dependency_fingerprint: str
    dependency_dockerfile: str
    dockerfile: str
    files: Mapping[str, bytes]
    bootstrap: tuple[str, bytes]
    labels: Mapping[str, str]
    notes: tuple[str, ...]

    @property
    def recipe(self) -> str:
        return self.labels["relay.build"]

    def context(self) -> bytes:
        return function_context(self.dockerfile, self.files, *self.bootstrap)


class DockerImageBuilder:
    """Builds, reuses and retires images; implements ``ImageBuilder``.

    ``collect_grace`` (default: the build timeout) protects images built that
    recently from collection: an unreferenced dependency image or a failed
    build's leftover may still be the base of a build running in another
    worker on the same engine, and a function image this builder never prepared
    may be another worker's (same function name, other sources) whose
    containers have not started yet. ``retire`` removes this builder's own
    superseded images at once.

    ``labels`` are added to every image built and narrow what cleanup looks at
    (tests use them to own exactly their images); they also enter the
    dependency fingerprint, so differently labelled builders never share a
    dependency image.
    """

    def __init__(
        self,
        docker: aiodocker.Docker,
        *,
        max_concurrent_builds: int = 2,
        labels: Mapping[str, str] | None = None,
        runtimes: Mapping[str, Runtime] = RUNTIMES,
        output_cap: int = OUTPUT_CAP_BYTES,
        build_timeout: float = 900.0,
        collect_grace: float | None = None,
    ) -> None:
        self._docker = docker
        self._builds = anyio.Semaphore(max_concurrent_builds)
        self._labels = dict(labels or {})
        self._runtimes = runtimes
        self._output_cap = output_cap
        self._build_timeout = build_timeout
        self._locks: dict[str, anyio.Lock] = {}
        self._in_flight = BuildsInFlight()
        self._architecture: str | None = None
        self._cleaner = DockerImageCleaner(
            docker,
            self._in_flight,
            labels=self._labels,
            collect_grace=build_timeout if collect_grace is None else collect_grace,
        )

    # --- prepare -----------------------------------------------------------------
    async def prepare(
        self, function: str, directory: Path, template: BuildTemplate
    ) -> FunctionImage:
        try:
            return await self._prepare(function, directory, template)
        except BuildError as exc:
            raise BuildError(f'function "{function}": {exc}', exc.output) from exc

    async def _prepare(
        self, function: str, directory: Path, template: BuildTemplate
    ) -> FunctionImage:
        plan = await self._plan(function, directory, template)
        tag, dep_tag = plan.image.image, plan.dependency_tag
        async with self._lock(tag):
            self._in_flight.prepared.add(normal(tag))  # this worker's: it may retire it
            existing = await self._inspect(tag)
            if existing is not None and labels_of(existing).get("relay.build") == plan.recipe:
                # DEBUG: every periodic full pass gets here for every function;
                # a change worth reading is logged once as function_prepared.
                log.debug("function_image_reused", function=function, image=tag)
                return plan.image
            pins = [normal(tag), normal(dep_tag)]
            self._in_flight.pinned.update(pins)
            try:
                await self._ensure_dependency(plan)
                await self._build(
                    tag, plan.context(), plan.labels, kind="function", notes=plan.notes
                )
            finally:
                self._in_flight.pinned.subtract(pins)
        return msgspec.structs.replace(plan.image, built=True)

    async def _plan(self, function: str, directory: Path, template: BuildTemplate) -> _Plan:
        """Everything a build needs, decided before any build starts (so a project
        error never leaves a half-built dependency image behind)."""
        runtime = self._runtime(template.runtime)
        sources = await anyio.to_thread.run_sync(_read, directory)
        fp = fingerprint(sources)
        try:
            tag = image_tag(function, fp)
        except ValueError as exc:
            raise BuildError(str(exc)) from None
        dependencies = runtime.plan_dependencies(app_files(sources))
        fn_plan = runtime.plan_function(app_files(sources), handler_modules(template))
        dep_fp, dep_dockerfile = await self._dependency_recipe(runtime, dependencies)
        dep_tag = f"relay-dep-{runtime.name}-{dep_fp[:DEPENDENCY_TAG_HEX]}"
        boot_path, boot_bytes = bootstrap_source(runtime.name)
        stage = {**self._labels, "relay.type": "function-stage", "relay.function": function}
        command = bootstrap_command(runtime.name)
        dockerfile = render_function_dockerfile(dep_tag, fn_plan, command, stage)
        recipe = fingerprint([("Dockerfile", dockerfile.encode()), (boot_path, boot_bytes)])
        labels = {
            **self._labels,
            "relay.type": "function",
            "relay.function": function,
            "relay.runtime": runtime.name,
            "relay.fingerprint": fp,
            "relay.dependency": dep_tag,
            "relay.bootstrap-version": BOOTSTRAP_VERSION,
            "relay.build": recipe[:DEPENDENCY_TAG_HEX],
        }
        image = FunctionImage(
            function=function,
            runtime=runtime.name,
            fingerprint=fp,
            image=tag,
            dependency_image=dep_tag,
            built=False,
        )
        return _Plan(
            image=image,
            runtime=runtime,
            dependencies=dependencies,
            dependency_tag=dep_tag,
            dependency_fingerprint=dep_fp,
            dependency_dockerfile=dep_dockerfile,
            dockerfile=dockerfile,
            files=app_files(sources, fn_plan),
            bootstrap=(boot_path, boot_bytes),
            labels=labels,
            notes=fn_plan.notes,
        )

    def _runtime(self, name: str | None) -> Runtime:
        if name is None:
            raise BuildError("the template declares no runtime; a handler needs one")
        try:
            return self._runtimes[name]
        except KeyError:
            known = ", ".join(sorted(self._runtimes))
            raise BuildError(f"unknown runtime {name!r} (supported: {known})") from None

    async def _dependency_recipe(self, runtime: Runtime, plan: DependencyPlan) -> tuple[str, str]:
        """The dependency image's full fingerprint and its Dockerfile."""
        stage = {**self._labels, "relay.type": "dependency-stage", "relay.runtime": runtime.name}
        dockerfile = render_dependency_dockerfile(runtime, plan, stage)
        parts = [
            ("relay/recipe", b"dependency-v1"),
            ("relay/runtime", runtime.name.encode()),
            ("relay/architecture", (await self._arch()).encode()),
            ("relay/base-image", runtime.base_image.encode()),
            ("relay/installer", runtime.installer.encode()),
            ("relay/dockerfile", dockerfile.encode()),
            *((f"relay/label/{k}", v.encode()) for k, v in sorted(self._labels.items())),
            *((f"manifest/{name}", data) for name, data in plan.manifests),
        ]
        return fingerprint(parts), dockerfile

    async def _ensure_dependency(self, plan: _Plan) -> None:
        tag = plan.dependency_tag
        async with self._lock(tag):
            if await self._inspect(tag) is not None:
                return
            labels = {
                **self._labels,
                "relay.type": "dependency",
                "relay.runtime": plan.runtime.name,
                "relay.fingerprint": plan.dependency_fingerprint,
            }
            context = dependency_context(plan.dependency_dockerfile, plan.dependencies)
            kind = plan.dependencies.kind
            await self._build(tag, context, labels, kind="dependency", notes=(kind,))

    async def _build(
        self,
        tag: str,
        context: bytes,
        labels: Mapping[str, str],
        *,
        kind: str,
        notes: tuple[str, ...] = (),
    ) -> None:
        output = CappedOutput(self._output_cap)
        async with self._builds:
            self._in_flight.running += 1
            started = time.monotonic()
            log.info("image_build_started", image=tag, kind=kind, notes=list(notes))
            try:
                with anyio.fail_after(self._build_timeout):
                    error = await self._stream_build(tag, context, labels, output)
            except TimeoutError as exc:
                message = f"building {kind} image {tag} took longer than {self._build_timeout:g}s"
                raise BuildError(message, output.text()) from exc
            finally:
                self._in_flight.running -= 1
        if error is not None:
            text = output.text()
            summary = summarize_failure(error, text)
            log.warning("image_build_failed", image=tag, kind=kind, error=summary)
            raise BuildError(f"{kind} image build failed: {summary}", text)
        if await self._inspect(tag) is None:
            raise BuildError(f"{kind} image {tag} missing after a build", output.text())
        log.info("image_built", image=tag, kind=kind, seconds=round(time.monotonic() - started, 2))

    async def _stream_build(
        self, tag: str, context: bytes, labels: Mapping[str, str], output: CappedOutput
    ) -> str | None:
        """Run one classic-builder build, recording its output; its error, if any."""
        try:
            return await stream_build(
                self._docker, tag=tag, context=context, labels=labels, output=output
            )
        except DockerError as exc:
            raise DependencyUnavailable(
                f"the Docker engine refused to build {tag}: {exc.message}"
            ) from exc

    # --- cleanup (DockerImageCleaner) ------------------------------------------
    async def retire(self, function: str, keep: Collection[str]) -> list[str]:
        return await self._cleaner.retire(function, keep)

    async def collect_dependency_images(self) -> list[str]:
        return await self._cleaner.collect_dependency_images()

    # --- helpers -----------------------------------------------------------------
    async def _inspect(self, tag: str) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = await self._docker.images.inspect(tag)
        except DockerError as exc:
            if exc.status == _NOT_FOUND:
                return None
            raise DependencyUnavailable(f"cannot inspect image {tag}: {exc.message}") from exc
        return info

    async def _arch(self) -> str:
        if self._architecture is None:
            try:
                # /version (Arch), which the socket proxy's allow-list grants; /info it does not
                info = await self._docker.version()
            except DockerError as exc:
                raise DependencyUnavailable(f"cannot query the Docker engine: {exc}") from exc
            arch = str(info.get("Arch", "unknown"))
            # the name /info gave before (uname -m), so image versions stay the same
            self._architecture = _UNAME_ARCH.get(arch, arch)
        return self._architecture

    @asynccontextmanager
    async def _lock(self, key: str) -> AsyncIterator[None]:
        """One prepare per image name at a time; the lock is dropped once nobody
        holds or waits for it, so versions do not accumulate locks."""
        lock = self._locks.setdefault(key, anyio.Lock())
        try:
            async with lock:
                yield
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._locks.pop(key, None)


def _read(directory: Path) -> list[tuple[str, bytes]]:
    if not directory.is_dir():
        raise BuildError(f"{directory} is not a directory")
    return read_sources(directory, select_sources(directory))
