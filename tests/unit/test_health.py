"""``relay health`` reports a missing or invalid REDIS_URI before connecting to anything."""

from __future__ import annotations

import pytest

from relay.entrypoints.health import check_health

pytestmark = pytest.mark.anyio


async def test_missing_redis_uri_is_one_line() -> None:
    problem = await check_health({})
    assert problem is not None
    assert problem.startswith("REDIS_URI is required: host:port")
    assert "\n" not in problem


@pytest.mark.parametrize("uri", ["redis", "http://h:1", "h:99999"])
async def test_invalid_redis_uri_is_one_line(uri: str) -> None:
    problem = await check_health({"REDIS_URI": uri})
    assert problem is not None
    assert problem.startswith(f"REDIS_URI={uri!r} is invalid")
    assert "\n" not in problem


async def test_stream_and_group_are_not_required_for_health() -> None:
    # Only REDIS_URI matters here: an unreachable address fails at the ping, not in config.
    problem = await check_health({"REDIS_URI": "127.0.0.1:1"})
    assert problem is not None
    assert problem.startswith("redis at 127.0.0.1:1 is unreachable")
