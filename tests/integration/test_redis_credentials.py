"""A REDIS_URI holding a password, against a real Redis that refuses it: every
command that connects says so in one line that never holds the password."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

pytestmark = pytest.mark.redis

RELAY = str(Path(sys.executable).parent / "relay")


@pytest.fixture
def acl_user(redis_url: str, unique: str) -> Iterator[str]:
    """A Redis user of this test's own with a real password; removed afterwards."""
    client = redis.Redis.from_url(redis_url)
    client.acl_setuser(
        unique, enabled=True, passwords=["+right-pw"], keys=["*"], commands=["+@all"]
    )
    try:
        yield unique
    finally:
        client.acl_deluser(unique)
        client.close()


def test_a_refused_password_is_one_line_without_the_password(
    redis_url: str, acl_user: str, unique: str, tmp_path: Path
) -> None:
    canary = f"canary-{unique}-pw"
    uri = redis_url.replace("redis://", f"redis://{acl_user}:{canary}@")
    env = {
        **os.environ,
        "REDIS_URI": uri,
        "REDIS_STREAM": f"events-{unique}",
        "REDIS_GROUP": f"group-{unique}",
        "RELAY_STATE_DIR": str(tmp_path / "state"),
        "RELAY_RUN_DIR": str(tmp_path / "run"),
    }
    functions = tmp_path / "functions"
    functions.mkdir()
    commands = [
        ["health"],
        ["dlq", "ls"],
        ["trace", "1-1"],
        ["start", "--functions", str(functions)],
    ]
    for args in commands:
        result = subprocess.run(
            [RELAY, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert canary not in result.stdout + result.stderr, args
        assert "Traceback" not in result.stderr, args
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("relay: "), (args, last)
        assert "WRONGPASS" in last or "invalid username-password" in last, (args, last)
