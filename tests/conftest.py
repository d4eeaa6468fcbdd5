"""Root test configuration: anyio on asyncio, and the test bed fixtures."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

pytest_plugins = ["tests.testbed", "tests.gitbed"]

# Property tests: a quick default for every run; HYPOTHESIS_PROFILE=thorough for a
# deeper search (10x the examples) before a release or after touching the matcher.
settings.register_profile("default", max_examples=150, deadline=None)
settings.register_profile("thorough", max_examples=1500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
