"""Render Dockerfiles and build contexts from runtime registry entries.

Two images per function version:

- the dependency image ``relay-dep-<runtime>-<16 hex>``: the runtime's base
  image, its preamble (the pinned uv binary for Python) and the installed
  manifests; shared by every function and version with the same inputs;
- the function image ``relay-fn-<name>:<16 hex>``: ``FROM`` the dependency
  image, the selected source at ``/app`` (``template.yaml`` excepted), the
  bootstrap, and the runtime's function build step (the TypeScript bundle).

Build contexts are in-memory tar archives; nothing is ever written into the
function directory. File modes are normalised (0644 files, 0755 directories,
owner root) so every file is readable by the unprivileged container user, and
so the image, like the fingerprint, does not depend on file metadata.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterable, Mapping, Sequence

from relay.adapters.docker.runtimes import APP_DIR, DependencyPlan, FunctionPlan, Runtime

TEMPLATE_FILE = "template.yaml"
_ROOT_CONTEXT = "root"


def _run(script: str) -> str:
    # Exec form with an explicit shell: JSON quoting survives any script text.
    return "RUN " + json.dumps(["/bin/sh", "-c", script])


def _env(env: Mapping[str, str]) -> list[str]:
    if not env:
        return []
    return ["ENV " + " ".join(f"{key}={json.dumps(value)}" for key, value in sorted(env.items()))]


def _label(labels: Mapping[str, str]) -> list[str]:
    if not labels:
        return []
    return ["LABEL " + " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))]


def render_dependency_dockerfile(
    runtime: Runtime, plan: DependencyPlan, stage_labels: Mapping[str, str] | None = None
) -> str:
    """The dependency image's Dockerfile (its context holds the manifests). The
    runtime's environment and working directory live here, so the function
    image on top is as few build steps as possible.

    ``stage_labels`` go on every intermediate image of the build (a LABEL right
    after FROM): a failed build's leftovers are then Relay's to collect, never
    anonymous images. The finished image's own labels come from the build call
    and override them."""
    lines = [
        f"FROM {runtime.base_image}",
        *_label(stage_labels or {}),
        *runtime.dependency_preamble,
        *_env(runtime.env),
        f"WORKDIR {APP_DIR}",
    ]
    if plan.install is not None:
        names = " ".join(name for name, _ in plan.manifests)
        lines.append(f"COPY {names} {plan.workdir}/")
        lines.append(_run(plan.install))
    return "\n".join(lines) + "\n"


def render_function_dockerfile(
    dependency_image: str,
    plan: FunctionPlan,
    command: Sequence[str],
    stage_labels: Mapping[str, str] | None = None,
) -> str:
    """The function image's Dockerfile: one COPY puts the source at ``/app`` and
    the bootstrap in place (its context mirrors the image's root under
    ``root/``), then the runtime's build step, if any, and the bootstrap command.
    The working directory (``/app``) is inherited from the dependency image;
    ``stage_labels`` as for the dependency image."""
    lines = [f"FROM {dependency_image}", *_label(stage_labels or {}), f"COPY {_ROOT_CONTEXT}/ /"]
    if plan.build is not None:
        lines.append(_run(plan.build))
    lines.append("CMD " + json.dumps(list(command)))
    return "\n".join(lines) + "\n"


def app_files(
    sources: Iterable[tuple[str, bytes]], plan: FunctionPlan | None = None
) -> dict[str, bytes]:
    """The files that land in ``/app``: the selected source without
    ``template.yaml`` (the spec keeps it out of the image; it still counts in
    the fingerprint), plus what the runtime injects."""
    files = {path: data for path, data in sources if path != TEMPLATE_FILE}
    if plan is not None:
        for path, data in plan.injected:
            files.setdefault(path, data)
    return files


def dependency_context(dockerfile: str, plan: DependencyPlan) -> bytes:
    """The tar build context of a dependency image."""
    return _tar([("Dockerfile", dockerfile.encode()), *plan.manifests])


def function_context(
    dockerfile: str, files: Mapping[str, bytes], bootstrap_path: str, bootstrap: bytes
) -> bytes:
    """The tar build context of a function image: the Dockerfile, and under
    ``root/`` the source at ``app/`` and the bootstrap at its image path."""
    app = f"{_ROOT_CONTEXT}{APP_DIR}"
    entries = [
        ("Dockerfile", dockerfile.encode()),
        (f"{_ROOT_CONTEXT}/{bootstrap_path.lstrip('/')}", bootstrap),
        *((f"{app}/{path}", data) for path, data in sorted(files.items())),
    ]
    return _tar(entries, directories=(_ROOT_CONTEXT, app))


def _tar(entries: Iterable[tuple[str, bytes]], directories: Iterable[str] = ()) -> bytes:
    buffer = io.BytesIO()
    written: set[str] = set()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for directory in directories:
            _add_dir(archive, directory, written)
        for path, data in entries:
            parent = path.rpartition("/")[0]
            if parent:
                _add_parents(archive, parent, written)
            info = _info(path, tarfile.REGTYPE, 0o644)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _add_parents(archive: tarfile.TarFile, directory: str, written: set[str]) -> None:
    parts = directory.split("/")
    for depth in range(1, len(parts) + 1):
        _add_dir(archive, "/".join(parts[:depth]), written)


def _add_dir(archive: tarfile.TarFile, directory: str, written: set[str]) -> None:
    if directory not in written:
        written.add(directory)
        archive.addfile(_info(directory, tarfile.DIRTYPE, 0o755))


def _info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info
