"""Root test configuration: anyio on asyncio, and the test bed fixtures."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.testbed"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
