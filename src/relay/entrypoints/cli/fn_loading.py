"""Loading function directories for the authoring commands (validate, match, run)
and the offline catalog: discovery, the template and what the image build would
refuse. A shared helper: it imports no command module."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from relay.adapters.docker.runtimes import RUNTIMES
from relay.adapters.fs.source import read_sources, select_sources
from relay.adapters.fs.templates import TEMPLATE_FILE, load_template
from relay.domain.errors import BuildError, TemplateError
from relay.domain.functions import handler_modules
from relay.domain.names import function_name_problem
from relay.domain.source import FINGERPRINT_HEX_LEN, image_tag
from relay.domain.template import Template


class Loaded(msgspec.Struct, frozen=True):
    """One function directory: its template, or the problems that make it invalid."""

    name: str
    directory: Path
    template: Template | None
    problems: tuple[str, ...]


class PathNotFound(Exception):
    """A PATH argument names nothing, or a directory with no functions."""


def discover(path: Path) -> list[tuple[str, Path]]:
    """(name, directory) of every function at ``path``, sorted by name."""
    if path.is_file() and path.name == TEMPLATE_FILE:
        path = path.parent
    if not path.exists():
        raise PathNotFound(f"{path}: no such file or directory")
    if not path.is_dir():
        raise PathNotFound(f"{path}: not a directory (expected a function or functions directory)")
    if (path / TEMPLATE_FILE).is_file():
        return [(path.resolve().name, path)]
    found = sorted(
        (child.name, child)
        for child in path.iterdir()
        if child.is_dir() and (child / TEMPLATE_FILE).is_file()
    )
    if not found:
        raise PathNotFound(
            f"{path}: no functions found (neither it nor a direct subdirectory has a "
            f"{TEMPLATE_FILE})"
        )
    return found


def load(name: str, directory: Path, *, check_source: bool = True) -> Loaded:
    problems: list[str] = []
    name_problem = function_name_problem(name)
    if name_problem is not None:
        problems.append(f"invalid function name {json.dumps(name)}: {name_problem}")
    else:
        # The spec's name rule admits a few names (a trailing '-', '..', '___') that
        # Docker refuses as an image repository; the image build would fail on them.
        try:
            image_tag(name, "0" * FINGERPRINT_HEX_LEN)
        except ValueError as exc:
            problems.append(str(exc))
    template: Template | None = None
    try:
        template = load_template(directory / TEMPLATE_FILE)
    except TemplateError as exc:
        problems.extend(exc.problems)
    if template is not None and check_source:
        problems.extend(source_problems(directory, template))
    return Loaded(name, directory, None if problems else template, tuple(problems))


def source_problems(directory: Path, template: Template) -> list[str]:
    """What the image build would refuse, found from the selected source files alone:
    dependency manifests, Node handler modules, service files that are not source."""
    try:
        files = dict(read_sources(directory, select_sources(directory)))
    except (BuildError, OSError) as exc:
        return [f"source: {exc}"]
    problems: list[str] = []
    runtime = RUNTIMES.get(template.runtime or "")
    if runtime is not None and template.needs_runtime:
        try:
            runtime.plan_dependencies(files)
            runtime.plan_function(files, handler_modules(template))
        except BuildError as exc:
            problems.append(str(exc))
    for i, service in enumerate(template.services):
        if service.kind != "image" and service.source.removeprefix("./") not in files:
            problems.append(
                f"services[{i}].{service.kind}: {json.dumps(service.source)} is not a source "
                "file of the function (missing, or excluded by .gitignore)"
            )
    return problems
