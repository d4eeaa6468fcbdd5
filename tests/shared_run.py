"""What one test run shares across its pytest-xdist workers: a run id, a directory and
the test images built from it.

``scripts/test`` runs the tiers on several xdist workers (docs/testing.md). Every worker
is its own process with its own session fixtures (its own session Redis, its own
``tmp_path`` root), so most tests stay apart without knowing about the others. What must
be done once for the whole run, however many workers there are, is done here:

- ``run_id`` (``r<8 hex>``): made by the controller (or the only process without xdist)
  and handed to every worker, so all of them name the same shared things;
- ``shared_dir``: a directory of this run's own (lock files, what was built), removed
  at the end;
- ``shared_images`` (session): ``.build(name, context)`` builds a test image once per run
  under a content tag (a file lock around "build if missing"), labelled with the run id;
  the controller removes the run's images when the whole run is over.

Tests that cannot run beside others are marked ``serial``: ``scripts/test`` runs them on
their own after the parallel part (``--serial=parallel|serial`` selects a part).

``--dist loadgroup`` is scheduled here, not by xdist: xdist 3.8 marks a group by
rewriting ``item._nodeid``, which pytest 9 no longer reads, so its groups are silently
ignored. ``GroupScheduling`` sends every test to any worker, except that a module whose
source names ``pytest.mark.xdist_group("NAME")`` goes whole, with every other module of
that group, to one worker (its module fixtures then set up once).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from filelock import FileLock

RUN_ID_KEY = "relay_test_run"
RUN_LABEL = "relay.test.run"
_RUN_ID = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial",
        choices=("all", "parallel", "serial"),
        default="all",
        help="run every test (all), only those that may run beside others (parallel), or "
        "only those marked serial (serial); scripts/test runs the two parts in turn",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--serial``: deselect (never skip) the part of the run not asked for. An option,
    not ``-m``, so that a ``-m`` of the caller's still applies to both parts."""
    part = config.getoption("--serial")
    if part == "all":
        return
    keep = [i for i in items if (i.get_closest_marker("serial") is not None) == (part == "serial")]
    dropped = [i for i in items if i not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and RUN_ID_KEY in workerinput:
        config.stash[_RUN_ID] = str(workerinput[RUN_ID_KEY])
    else:
        config.stash[_RUN_ID] = f"r{secrets.token_hex(4)}"


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent under -p no:xdist
def pytest_configure_node(node: Any) -> None:
    """Controller side: every worker gets the controller's run id."""
    node.workerinput[RUN_ID_KEY] = node.config.stash[_RUN_ID]


_GROUP = re.compile(r"""pytest\.mark\.xdist_group\(\s*["']([^"']+)["']""")


def module_group(path: Path) -> str | None:
    """The xdist group a test module names (see the module docstring), if any."""
    try:
        found = _GROUP.search(path.read_text(encoding="utf-8"))
    except OSError:
        return None
    return found.group(1) if found else None


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # an xdist hook: the controller's scheduler
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import (  # type: ignore[import-untyped]  # noqa: PLC0415 - only with xdist
        LoadScopeScheduling,
    )

    root = config.rootpath
    groups: dict[str, str | None] = {}

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """One work unit per test, or per group; bigger units are handed out first."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path not in groups:
                groups[path] = module_group(root / path)
            group = groups[path]
            return f"xdist_group:{group}" if group else nodeid

    return GroupScheduling(config, log)


def is_controller(config: pytest.Config) -> bool:
    """The process that outlives every worker (or the only one, without xdist)."""
    return not hasattr(config, "workerinput")


def run_id(config: pytest.Config) -> str:
    return config.stash[_RUN_ID]


def shared_dir(config: pytest.Config) -> Path:
    """This run's directory, the same path in every worker; created on first use."""
    path = Path(tempfile.gettempdir()) / f"relay-test-run-{run_id(config)}"
    path.mkdir(exist_ok=True)
    return path


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller removes what the workers built for the whole run, once at the end."""
    config = session.config
    if not is_controller(config):
        return
    path = Path(tempfile.gettempdir()) / f"relay-test-run-{run_id(config)}"
    if not path.exists():
        return
    tags = [p.read_text() for p in sorted((path / "images").glob("*.tag"))]
    if tags:
        client = docker.from_env()
        try:
            for tag in tags:
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    client.images.remove(tag, force=True)
        finally:
            client.close()
    shutil.rmtree(path, ignore_errors=True)


def context_digest(context: Path) -> str:
    """A digest of every file's relative path and bytes under ``context``."""
    digest = hashlib.sha256()
    for file in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(context)).encode() + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


class SharedImages:
    """Test images built at most once per run, whichever worker asks first."""

    def __init__(self, config: pytest.Config, client: Any) -> None:
        self._run = run_id(config)
        self._dir = shared_dir(config) / "images"
        self._dir.mkdir(exist_ok=True)
        self._client = client

    def build(self, name: str, context: Path, labels: dict[str, str] | None = None) -> str:
        """The tag ``name:<digest>-<run>`` of ``context`` (a directory with a Dockerfile),
        built now unless this run already has it. The tag carries the run id so that two
        runs on one engine never remove each other's images."""
        tag = f"{name}:{context_digest(context)[:12]}-{self._run}"
        stem = hashlib.sha256(tag.encode()).hexdigest()[:16]
        with FileLock(str(self._dir / f"{stem}.lock")):
            record = self._dir / f"{stem}.tag"
            if not record.exists():
                self._client.images.build(
                    path=str(context),
                    tag=tag,
                    rm=True,
                    forcerm=True,
                    labels={**(labels or {}), RUN_LABEL: self._run},
                )
                record.write_text(tag)
        return tag


@pytest.fixture(scope="session")
def shared_images(pytestconfig: pytest.Config) -> Iterator[SharedImages]:
    """``SharedImages`` of this run (see the module docstring)."""
    client = docker.from_env(timeout=300)
    yield SharedImages(pytestconfig, client)
    client.close()
