"""A function whose handler fails until the event's ``fail_until`` has passed:
its first delivery is dead-lettered, and a replay after that time succeeds (the
DLQ replay tests, CLI and console)."""

from __future__ import annotations

from pathlib import Path

FUNCTION = "flaky"
TEMPLATE = """\
runtime: python3.14
events:
  - handler: jobs.flaky.handler
    pattern:
      kind: [flaky]
    retries: 0
"""
FLAKY = """\
import time


def handler(event):
    if time.time() < event["fail_until"]:
        raise RuntimeError("failing until fail_until")
    print("flaky ok", event["n"], flush=True)
"""
# Long enough for the first delivery to fail on a loaded machine; the replay waits
# until it has passed.
FAILING_FOR_S = 20.0


def write_flaky_function(functions: Path) -> None:
    fn = functions / FUNCTION
    (fn / "jobs").mkdir(parents=True)
    (fn / "template.yaml").write_text(TEMPLATE)
    (fn / "jobs" / "flaky.py").write_text(FLAKY)
