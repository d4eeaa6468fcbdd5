"""Service containers and service images on the Docker engine.

``DockerServiceImages`` resolves a service's image: the function image with the
runtime's command (``entrypoint``), a user Dockerfile built through the Engine
API over the function's selected source (``build``, tagged in the function's own
``relay-fn-<name>`` repository, content-addressed), or an external reference
inspected locally and pulled when missing or when its hourly window has passed
(``image``; Relay never removes those).

``DockerServiceContainers`` lists, starts and removes this worker's hardened
service containers (scoped by ``relay.hostname``). No host port is published.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import aiodocker
import anyio
import anyio.to_thread
import structlog
from aiodocker.exceptions import DockerError

from relay.adapters.docker.build_output import CappedOutput, stream_build, summarize_failure
from relay.adapters.docker.containers import USER, hardened_host_config
from relay.adapters.docker.dockerfiles import app_files
from relay.adapters.docker.runtimes import RUNTIMES, Runtime
from relay.adapters.fs.source import read_sources, select_sources
from relay.domain.errors import RelayError
from relay.domain.functions import FunctionImage
from relay.domain.services import (
    SERVICE_TYPE,
    DesiredService,
    ObservedReplica,
    ResolvedImage,
    container_name,
)
from relay.domain.source import fingerprint, image_tag
from relay.domain.template import ServiceSpec

log = structlog.get_logger(__name__)

FRESHNESS_S: Final = 3600.0
STOP_TIMEOUT_S: Final = 5
APP_DIR: Final = "/app"
_NOT_FOUND = 404
_CONFLICT = 409


class ServiceImageError(RelayError):
    """A service's image could not be resolved (one line naming the service)."""


def _read(directory: Path) -> list[tuple[str, bytes]]:
    if not directory.is_dir():
        raise ServiceImageError(f"{directory} is not a directory")
    return read_sources(directory, select_sources(directory))


def _selected(directory: Path) -> frozenset[str]:
    if not directory.is_dir():
        raise ServiceImageError(f"{directory} is not a directory")
    return frozenset(select_sources(directory).files)


def build_fingerprint(source_fp: str, dockerfile: str) -> str:
    """The source fingerprint folded with the Dockerfile path (a second build
    service over the same source, with another Dockerfile, gets its own tag)."""
    return hashlib.sha256(f"{source_fp}\x00build\x00{dockerfile}".encode()).hexdigest()


def _context(files: Mapping[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class DockerServiceImages:
    """``ServiceImages`` on a Docker engine; see the module docstring."""

    def __init__(
        self,
        docker: aiodocker.Docker,
        *,
        runtimes: Mapping[str, Runtime] = RUNTIMES,
        labels: Mapping[str, str] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        build_timeout: float = 900.0,
    ) -> None:
        self._docker = docker
        self._runtimes = runtimes
        self._labels = dict(labels or {})
        self._monotonic = monotonic
        self._build_timeout = build_timeout
        self._checked: dict[tuple[str, str], float] = {}  # (function, identity) -> when
        self._builds = anyio.Semaphore(1)

    async def source_version(self, function: str, directory: Path) -> FunctionImage:
        sources = await anyio.to_thread.run_sync(_read, directory)
        return FunctionImage(
            function=function,
            runtime="",
            fingerprint=fingerprint(sources),
            image="",
            dependency_image=None,
            built=False,
        )

    async def resolve(
        self,
        function: str,
        directory: Path,
        service: ServiceSpec,
        *,
        runtime: str | None,
        function_image: str | None,
    ) -> ResolvedImage:
        try:
            if service.kind == "entrypoint":
                return await self._entrypoint(directory, service, runtime, function_image)
            if service.kind == "build":
                return await self._build(function, directory, service)
            return await self._external(function, service)
        except ServiceImageError as exc:
            raise ServiceImageError(f'service "{service.identity}": {exc}') from None

    # --- entrypoint ----------------------------------------------------------------
    async def _entrypoint(
        self, directory: Path, service: ServiceSpec, runtime: str | None, image: str | None
    ) -> ResolvedImage:
        known = self._runtimes.get(runtime or "")
        if known is None:
            raise ServiceImageError(f"an entrypoint needs a runtime (got {runtime!r})")
        if not image:
            raise ServiceImageError("the function image is not built yet")
        selected = await anyio.to_thread.run_sync(_selected, directory)
        if service.source.removeprefix("./") not in selected:
            raise ServiceImageError(
                f"entrypoint {service.source} is not in the function's source "
                "(missing, or ignored by .gitignore), so it is not in the image"
            )
        if known.name.startswith("python"):
            command: tuple[str, ...] = ("python", "-m", service.python_module)
        else:
            command = ("node", f"{APP_DIR}/{service.source}")
        info = await self._inspect(image)
        if info is None:
            raise ServiceImageError(f"image {image} is missing")
        return ResolvedImage(
            image=image,
            image_id=str(info["Id"]),
            command=command,
            workdir=APP_DIR,
            env=dict(known.env),
        )

    # --- build ---------------------------------------------------------------------
    async def _build(self, function: str, directory: Path, service: ServiceSpec) -> ResolvedImage:
        sources = await anyio.to_thread.run_sync(_read, directory)
        files = app_files(sources)
        if service.source not in files:
            raise ServiceImageError(
                f"Dockerfile {service.source} is not in the function's source "
                "(missing, or ignored by .gitignore)"
            )
        folded = build_fingerprint(fingerprint(sources), service.source)
        tag = image_tag(function, folded)
        info = await self._inspect(tag)
        if info is None:
            labels = {
                **self._labels,
                "relay.type": "function",
                "relay.function": function,
                "relay.fingerprint": folded,
                "relay.service": service.identity,
            }
            await self._run_build(tag, _context(files), service.source, labels)
            info = await self._inspect(tag)
            if info is None:
                raise ServiceImageError(f"image {tag} missing after its build")
        return ResolvedImage(image=tag, image_id=str(info["Id"]))

    async def _run_build(
        self, tag: str, context: bytes, dockerfile: str, labels: Mapping[str, str]
    ) -> None:
        output = CappedOutput()
        async with self._builds:
            log.info("service_image_build_started", image=tag, dockerfile=dockerfile)
            try:
                with anyio.fail_after(self._build_timeout):
                    error = await stream_build(
                        self._docker,
                        tag=tag,
                        context=context,
                        labels=labels,
                        output=output,
                        dockerfile=dockerfile,
                    )
            except TimeoutError:
                raise ServiceImageError(
                    f"building {tag} took longer than {self._build_timeout:g}s"
                ) from None
            except DockerError as exc:
                raise ServiceImageError(
                    f"the Docker engine refused to build: {exc.message}"
                ) from None
        if error is not None:
            summary = summarize_failure(error, output.text())
            log.warning("service_image_build_failed", image=tag, error=summary)
            raise ServiceImageError(f"build of {dockerfile} failed: {summary}")
        log.info("service_image_built", image=tag)

    # --- external ------------------------------------------------------------------
    async def _external(self, function: str, service: ServiceSpec) -> ResolvedImage:
        ref = service.source
        key = (function, service.identity)
        info = await self._inspect(ref)
        checked = self._checked.get(key)
        due = checked is None or self._monotonic() - checked >= FRESHNESS_S
        if info is None or due:
            try:
                await self._docker.images.pull(ref)
            except DockerError as exc:
                # A failed check never advances the window: retried next pass.
                if info is None:
                    raise ServiceImageError(
                        f"image {ref} is not available locally and pulling it failed: {exc.message}"
                    ) from None
                log.warning(
                    "service_image_check_failed", image=ref, error=exc.message, using="local"
                )
            else:
                self._checked[key] = self._monotonic()
                info = await self._inspect(ref)
        if info is None:
            raise ServiceImageError(f"image {ref} is missing after a pull")
        return ResolvedImage(image=ref, image_id=str(info["Id"]))

    async def _inspect(self, ref: str) -> dict[str, Any] | None:
        try:
            info: dict[str, Any] = await self._docker.images.inspect(ref)
        except DockerError as exc:
            if exc.status == _NOT_FOUND:
                return None
            raise ServiceImageError(f"cannot inspect image {ref}: {exc.message}") from None
        return info


class DockerServiceContainers:
    """``ServiceContainers`` on a Docker engine; see the module docstring."""

    def __init__(self, docker: aiodocker.Docker, *, hostname: str) -> None:
        self._docker = docker
        self._hostname = hostname

    async def observe(self, function: str | None = None) -> list[ObservedReplica]:
        selectors = [f"relay.type={SERVICE_TYPE}", f"relay.hostname={self._hostname}"]
        if function is not None:
            selectors.append(f"relay.function={function}")
        try:
            found = await self._docker.containers.list(
                all=True, filters=json.dumps({"label": selectors})
            )
        except DockerError as exc:
            raise RelayError(f"docker could not list service containers: {exc.message}") from exc
        replicas = []
        for container in found:
            labels = dict(container["Labels"] or {})
            if labels.get("relay.hostname") != self._hostname:
                continue  # never trust a filter with someone else's container
            if function is not None and labels.get("relay.function") != function:
                continue
            replicas.append(
                ObservedReplica(
                    id=container.id, labels=labels, running=container["State"] == "running"
                )
            )
        return replicas

    async def start(self, desired: DesiredService, slot: int) -> str:
        name = container_name(desired.function, desired.spec.identity, slot, desired.generation)
        config = service_config(desired, slot)
        try:
            container = await self._create(name, config)
        except DockerError as exc:
            raise RelayError(f"could not create replica {slot}: {exc.message}") from None
        try:
            await container.start()
            info = await container.show()
        except DockerError as exc:
            await self._delete(container.id)
            raise RelayError(f"could not start replica {slot}: {exc.message}") from None
        state = info.get("State") or {}
        if not state.get("Running"):
            await self._delete(container.id)
            raise RelayError(f"replica {slot} exited at start (exit code {state.get('ExitCode')})")
        return str(container.id)

    async def _create(self, name: str, config: dict[str, Any]) -> Any:
        try:
            return await self._docker.containers.create(config=config, name=name)
        except DockerError as exc:
            if exc.status != _CONFLICT:
                raise
        # A container of the same generation and slot (it crashed, or a start
        # that failed half-way): this name is Relay's, replace it.
        await self._delete(name)
        return await self._docker.containers.create(config=config, name=name)

    async def remove(self, container_id: str) -> None:
        with anyio.CancelScope(shield=True):
            try:
                container = await self._docker.containers.get(container_id)
                await container.stop(t=STOP_TIMEOUT_S)
            except DockerError as exc:
                if exc.status == _NOT_FOUND:
                    return
            await self._delete(container_id)

    async def _delete(self, ref: str) -> None:
        try:
            container = await self._docker.containers.get(ref)
            await container.delete(force=True)
        except DockerError as exc:
            if exc.status not in (_NOT_FOUND, _CONFLICT):
                raise RelayError(f"could not remove container {ref}: {exc.message}") from None

    async def network_exists(self, name: str) -> bool:
        try:
            await self._docker.networks.get(name)
        except DockerError as exc:
            if exc.status == _NOT_FOUND:
                return False
            raise RelayError(f'docker could not inspect network "{name}": {exc.message}') from None
        return True


def service_config(desired: DesiredService, slot: int) -> dict[str, Any]:
    """The hardened create body of one replica: the execution containers' limits,
    no host port (the port is metadata), the routing network only when routed."""
    port = f"{desired.spec.port}/tcp"
    config: dict[str, Any] = {
        "Image": desired.image.image_id or desired.image.image,
        "Env": [f"{k}={v}" for k, v in sorted(desired.env.items())],
        "User": USER,
        "Labels": desired.labels(slot),
        "ExposedPorts": {port: {}},
        "HostConfig": {
            **hardened_host_config(),
            "RestartPolicy": {"Name": "no"},  # a crash is healed by the next pass
        },
    }
    if desired.image.command is not None:
        config["Entrypoint"] = list(desired.image.command)
        config["Cmd"] = []
    if desired.image.workdir is not None:
        config["WorkingDir"] = desired.image.workdir
    network = desired.labels(slot).get("relay.networks")
    if network:
        config["HostConfig"]["NetworkMode"] = network
        config["NetworkingConfig"] = {"EndpointsConfig": {network: {}}}
    return config
