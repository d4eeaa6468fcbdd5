"""``LOG_FORMAT=json``: a real worker (embedded broker, the Docker engine) writes
its log as JSON lines a shipper can read, from the first line to the last."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.embedded_support import no_redis_env
from tests.e2e.harness import FIRST_START_TIMEOUT_S, RelayWorker


@pytest.mark.timeout(180)
def test_a_worker_with_log_format_json_prints_json_lines(
    tmp_path: Path, functions_dir: Path, unique: str
) -> None:
    worker = RelayWorker(tmp_path / "w", functions_dir, {})
    worker.env = {
        **no_redis_env(),
        **{k: v for k, v in worker.env.items() if not k.startswith("REDIS_")},
        "RELAY_BROKER": "sqlite",
        "RELAY_BROKER_PATH": str(tmp_path / "broker.sqlite3"),
        "RELAY_HOSTNAME": f"logjson-{unique}",
        "LOG_LEVEL": "DEBUG",
        "LOG_FORMAT": "json",
    }
    worker.start(wait=False)
    try:
        worker.wait_for(r'"msg": "relay_started"', timeout=FIRST_START_TIMEOUT_S)
        assert worker.stop(timeout=60) == 0  # SIGTERM: the stop is logged too
    finally:
        worker.kill()
    lines = worker.output()
    assert len(lines) >= 2, lines
    records = [json.loads(line) for line in lines]  # every line, not only some
    for record in records:
        assert list(record)[:3] == ["time", "level", "msg"], record
        assert re.fullmatch(r"\S+T\d\d:\d\d:\d\d\.\d{3}Z", record["time"])
    assert "relay_started" in [r["msg"] for r in records]
