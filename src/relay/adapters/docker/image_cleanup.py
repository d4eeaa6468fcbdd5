"""Removing Relay's images: superseded function versions, unreferenced
dependency images, and what failed builds left behind.

Only images carrying ``relay.type`` (and the builder's scope labels, when it has
any) are ever looked at; nothing is forced, so the engine itself refuses to
delete an image a container or a child image still uses.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

import aiodocker
import structlog
from aiodocker.exceptions import DockerError

from relay.domain.errors import DependencyUnavailable

log = structlog.get_logger(__name__)

_NOT_FOUND = 404


class BuildsInFlight:
    """What the builder is doing right now, shared with the cleaner: image names
    a prepare is building or building from, and the number of running builds."""

    def __init__(self) -> None:
        self.pinned: Counter[str] = Counter()
        self.running = 0
        # every function image this builder prepared (built or reused) in this
        # process: its own to retire at once; another's only once past the grace
        self.prepared: set[str] = set()

    def is_pinned(self, tags: Collection[str]) -> bool:
        return any(self.pinned[normal(t)] > 0 for t in tags)


class DockerImageCleaner:
    """``retire`` and ``collect_dependency_images`` of ``DockerImageBuilder``."""

    def __init__(
        self,
        docker: aiodocker.Docker,
        in_flight: BuildsInFlight,
        *,
        labels: Mapping[str, str],
        collect_grace: float,
    ) -> None:
        self._docker = docker
        self._in_flight = in_flight
        self._labels = dict(labels)
        self._collect_grace = collect_grace

    async def retire(self, function: str, keep: Collection[str]) -> list[str]:
        images = await self._list_images("function", f"relay.function={function}")
        names, ids = await self._container_references()
        keep_set = {normal(k) for k in keep}
        removed: list[str] = []
        horizon = time.time() - self._collect_grace
        for image in images:
            tags = tags_of(image)
            if keep_set & {*tags, image["Id"]}:
                continue
            if self._in_flight.is_pinned(tags):
                continue
            if tags and not self._in_flight.prepared & {normal(t) for t in tags} and (
                float(image.get("Created") or 0) > horizon
            ):
                # Tagged, not this worker's, and just built: another worker on this engine
                # serving a function of the same name from other sources, whose
                # containers may not have started yet (a later pass retires it
                # once it is past the grace and unused).
                log.debug("function_image_not_ours", function=function, image=tags)
                continue
            if image["Id"] in ids or names & {normal(t) for t in tags}:
                log.info("function_image_in_use", function=function, image=tags or image["Id"])
                continue
            removed.extend(await self._remove(tags or [image["Id"]]))
            self._in_flight.prepared.difference_update(normal(t) for t in tags)
        await self._collect_stages("function", f"relay.function={function}")
        if removed:
            await self.collect_dependency_images()
        return removed

    async def collect_dependency_images(self) -> list[str]:
        """Remove dependency images no function image names in ``relay.dependency``
        (and none younger than the grace), then old failed-build leftovers."""
        used = {
            normal(labels_of(image).get("relay.dependency", ""))
            for image in await self._list_images("function")
        }
        removed: list[str] = []
        horizon = time.time() - self._collect_grace
        for image in await self._list_images("dependency"):
            tags = tags_of(image)
            if used & set(tags) or self._in_flight.is_pinned(tags):
                continue
            if float(image.get("Created") or 0) > horizon:
                # Just built, maybe by another worker on this engine whose function
                # image is still building FROM it: collected on a later pass.
                continue
            removed.extend(await self._remove(tags or [image["Id"]]))
        await self._collect_stages("dependency")
        return removed

    async def _collect_stages(self, kind: str, *more: str) -> None:
        """Remove what failed builds left: untagged intermediate images carrying a
        stage label. Only when this builder has no build running and only those
        older than the build timeout, so no build still in progress (here or in
        another worker) can lose the image its next step starts from. A stage
        image with a child (a later build reused it as cache) is not listed at
        all: only top-level images are."""
        if self._in_flight.running:
            return
        horizon = time.time() - self._collect_grace
        for image in await self._list_images(f"{kind}-stage", *more):
            if tags_of(image) or float(image.get("Created") or 0) > horizon:
                continue
            await self._remove([image["Id"]])

    async def _remove(self, names: list[str]) -> list[str]:
        removed = []
        for name in names:
            try:
                await self._docker.images.delete(name, force=False)
            except DockerError as exc:
                if exc.status == _NOT_FOUND:
                    continue
                # 409: a container or a child image still uses it; never forced.
                log.info("image_remove_skipped", image=name, reason=exc.message)
                continue
            log.info("image_removed", image=name)
            removed.append(name)
        return removed

    async def _container_references(self) -> tuple[set[str], set[str]]:
        """Image names from containers' ``relay.image`` labels, and image ids of
        every container in any state."""
        try:
            containers = await self._docker.containers.list(all=1)
        except DockerError as exc:
            raise DependencyUnavailable(f"cannot list containers: {exc.message}") from exc
        names: set[str] = set()
        ids: set[str] = set()
        for container in containers:
            labels = container["Labels"] or {}
            if labels.get("relay.image"):
                names.add(normal(labels["relay.image"]))
            if container["ImageID"]:
                ids.add(container["ImageID"])
        return names, ids

    async def _list_images(self, kind: str, *more: str) -> list[dict[str, Any]]:
        selectors = [f"relay.type={kind}", *more, *(f"{k}={v}" for k, v in self._labels.items())]
        try:
            images: list[dict[str, Any]] = await self._docker.images.list(
                filters={"label": selectors}
            )
        except DockerError as exc:
            raise DependencyUnavailable(f"cannot list images: {exc.message}") from exc
        return images


def tags_of(image: Mapping[str, Any]) -> list[str]:
    return [t for t in (image.get("RepoTags") or []) if t and t != "<none>:<none>"]


def normal(name: str) -> str:
    """``name`` with the implicit ``:latest`` the engine reports in ``RepoTags``."""
    if not name or name.startswith("sha256:"):
        return name
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def labels_of(image: Mapping[str, Any]) -> dict[str, str]:
    labels = image.get("Labels")
    if labels is None:
        labels = (image.get("Config") or {}).get("Labels")
    return dict(labels or {})
