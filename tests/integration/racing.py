"""Processes started together: each waits for a file before it acts, so they race
for real (the concurrent-publish tests of both brokers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def race(code: str, args: list[str], go: Path, processes: int = 2) -> list[str]:
    """Run ``code`` (``python -c``) in ``processes`` processes with ``args``, then
    the process number, and ``go`` before it; touch ``go`` once every one started.
    What they printed, split into words; each must exit 0."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args, str(go), str(n)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for n in range(processes)
    ]
    go.touch()
    answers: list[str] = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        answers += out.decode().split()
    return answers
