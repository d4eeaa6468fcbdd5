"""Drive an in-container bootstrap (Python or Node) as a plain host subprocess.

Speaks the request/answer protocol of ``relay.adapters.docker.bootstraps``: one
JSON request per line on stdin, the handler's output then one nonce-framed
answer on stderr.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO


def write_app(root: Path, files: Mapping[str, str]) -> Path:
    """The function's files under ``root`` (subdirectories created)."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def read_answer(stderr: IO[bytes], nonce: str) -> tuple[dict[str, object], str]:
    """Read stderr up to the one answer frame; the answer and the output before it."""
    marker = b"\x1erelay-end:" + nonce.encode()
    data = b""
    while marker not in data or not data.endswith(b"\n"):
        data += stderr.read1(65536)  # type: ignore[attr-defined]
    output, _, frame = data.partition(marker)
    answer = json.loads(frame)
    assert isinstance(answer, dict)
    return {"id": nonce, **answer}, output.decode()


class BootstrapProcess:
    """One bootstrap process serving requests for the app in ``cwd``.

    ``timeout_s``, when given, goes into every request (else the bootstrap's own
    default applies). ``stdout`` holds what the process wrote to fd 1 by ``close``.
    """

    def __init__(
        self,
        argv: Sequence[str],
        cwd: Path,
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
        )
        self.timeout_s = timeout_s
        self.count = 0
        self.stdout = b""

    def call(
        self,
        handler: str,
        event: object = None,
        *,
        extra: Mapping[str, object] | None = None,
        **env: str,
    ) -> tuple[dict[str, object], str]:
        """Send one request (``extra``: more request fields); the answer frame and
        the stderr up to the end marker."""
        assert self.process.stdin
        assert self.process.stdout
        assert self.process.stderr
        self.count += 1
        nonce = f"nonce{self.count}"
        fields: dict[str, object] = {"env": env, **(extra or {})}
        if self.timeout_s is not None:
            fields["timeout_s"] = self.timeout_s
        self.process.stdin.write(request_line(nonce, handler, event, **fields))
        self.process.stdin.flush()
        return read_answer(self.process.stderr, nonce)

    def close(self) -> int:
        if self.process.stdin:
            self.process.stdin.close()
        code = self.process.wait(timeout=10)
        if self.process.stdout and not self.process.stdout.closed:
            self.stdout += self.process.stdout.read()
        for stream in (self.process.stdout, self.process.stderr):
            if stream:
                stream.close()
        return code


def request_line(nonce: str, handler: str, event: object = None, **fields: object) -> bytes:
    """One request as Relay writes it."""
    request = {"id": nonce, "handler": handler, "env": {}, "event": json.dumps(event or {})}
    return json.dumps({**request, **fields}).encode() + b"\n"


class RelaySocket:
    """A Unix socket listening as Relay's does, for a bootstrap's ``RELAY_CHANNEL``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.listener.settimeout(10)
        self.conn: socket.socket | None = None

    def accept(self) -> socket.socket:
        self.conn, _ = self.listener.accept()
        self.conn.settimeout(10)
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


def check_env_does_not_leak(boot: BootstrapProcess, meddle: str, show_env: str) -> None:
    """``meddle`` prints its environment (``ENV {...}``) then changes it; the next
    requests see exactly their own. The process was started with ``KEPT=original``."""
    show = {"show": ["KEPT", "RELAY_HANDLER"]}
    _, first = boot.call(meddle, show, KEPT="override")
    _, second = boot.call(show_env, show, KEPT="override")
    _, third = boot.call(show_env, show)
    request = {"KEPT": "override", "RELAY_HANDLER": show_env}
    assert json.loads(first.removeprefix("ENV ")) == {**request, "RELAY_HANDLER": meddle}
    assert json.loads(second.removeprefix("ENV ")) == request
    assert json.loads(third.removeprefix("ENV ")) == {"KEPT": "original", "RELAY_HANDLER": show_env}
