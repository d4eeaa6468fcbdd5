"""Root test configuration: anyio on asyncio, and the test bed fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import structlog
from hypothesis import settings

pytest_plugins = ["tests.testbed", "tests.gitbed", "tests.shared_run"]

# Property tests: a quick profile for every run (CI included); a deeper search (15x the
# examples) before a release or after touching the matcher, with either
# `--hypothesis-profile=thorough` (hypothesis' own pytest flag, which wins) or
# HYPOTHESIS_PROFILE=thorough (what scripts/test passes on to every xdist worker).
settings.register_profile("default", max_examples=100, deadline=None)
settings.register_profile("thorough", max_examples=1500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _structlog_config_restored() -> Iterator[None]:
    """A command run in-process (``relay function run`` configures logging for its
    process) binds structlog to that run's captured stderr, closed once the run
    ends: every test leaves the configuration as it found it."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
