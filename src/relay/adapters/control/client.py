"""The CLI's side of the control socket: one request, one answer, blocking.

``request`` raises :class:`WorkerUnavailable` when no worker answers on the
socket, and :class:`ControlRequestError` (one line, with the worker's error
``kind``) when the worker answers with an error.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import msgspec

from relay.adapters.control.protocol import MAX_RESPONSE_BYTES, encode_request
from relay.domain.commands import GetHealth, GetPoolState
from relay.domain.errors import DependencyUnavailable, RelayError
from relay.domain.messages import Command

DEFAULT_TIMEOUT = 10.0


class WorkerUnavailable(DependencyUnavailable):
    """No worker answers on the control socket."""

    @property
    def absent(self) -> bool:
        """No worker runs at all (no socket, or nobody listens on it), as opposed
        to one that runs but could not be reached or did not answer in time: only
        then may a command take its offline path."""
        return isinstance(self.__cause__, FileNotFoundError | ConnectionRefusedError)


class ControlRequestError(RelayError):
    """The worker answered with an error; ``kind`` names its error class."""

    def __init__(self, message: str, kind: str) -> None:
        self.kind = kind
        super().__init__(message)


def request(socket_path: Path | str, command: Command, *, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """Send ``command`` to the worker and return its ``result``."""
    path = str(socket_path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise WorkerUnavailable(f"no relay worker is running (no answer on {path})") from exc
        except PermissionError as exc:
            msg = f"cannot reach the relay worker at {path}: permission denied"
            raise WorkerUnavailable(msg) from exc
        except OSError as exc:
            raise WorkerUnavailable(f"cannot reach the relay worker at {path}: {exc}") from exc
        try:
            line = _exchange(sock, encode_request(command))
        except TimeoutError as exc:
            raise WorkerUnavailable(f"the relay worker did not answer within {timeout:g}s") from exc
        except OSError as exc:
            raise WorkerUnavailable(f"lost the connection to the relay worker: {exc}") from exc
    finally:
        sock.close()
    return _result(line)


def fetch_pool(
    socket_path: Path | str, name: str, *, timeout: float = 3.0
) -> dict[str, Any] | None:
    """The live pool snapshot of ``name``, or ``None`` when no worker answers or
    the function has no live pool (``relay function inspect`` renders ``unknown``)."""
    try:
        result = request(socket_path, GetPoolState(function=name), timeout=timeout)
    except RelayError:
        return None
    return result if isinstance(result, dict) else None


def fetch_health(socket_path: Path | str, *, timeout: float = 3.0) -> str | None:
    """For ``relay health``: ``None`` when no worker runs or the worker reports
    itself ready, else one line naming what is wrong with the running worker."""
    try:
        report = request(socket_path, GetHealth(), timeout=timeout)
    except WorkerUnavailable as exc:
        if exc.absent:
            return None  # no worker: the dependency checks alone decide
        return f"worker: {exc}"
    except RelayError as exc:
        return f"worker: {exc}"
    if isinstance(report, dict) and report.get("ready") is True:
        return None
    problems = report.get("problems") if isinstance(report, dict) else None
    return "worker not ready: " + "; ".join(problems or ["no readiness report"])


def _exchange(sock: socket.socket, request: bytes) -> bytes:
    """Send ``request`` and read the answer line. A worker that refuses the peer
    (its uid) answers and closes without reading, so the send can fail with a
    broken pipe while the refusal waits to be read: it is read and returned."""
    try:
        sock.sendall(request)
    except (BrokenPipeError, ConnectionResetError) as exc:
        try:
            return _read_line(sock)
        except (WorkerUnavailable, OSError):
            raise exc from None
    return _read_line(sock)


def _read_line(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise WorkerUnavailable("the relay worker closed the connection without an answer")
        end = chunk.find(b"\n")
        if end >= 0:
            chunks.append(chunk[:end])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise ControlRequestError("the worker's answer is too large", "ResponseTooLarge")


def _result(line: bytes) -> Any:
    try:
        reply = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise ControlRequestError("the worker's answer is not JSON", "BadResponse") from exc
    if not isinstance(reply, dict) or "ok" not in reply:
        raise ControlRequestError("the worker's answer is malformed", "BadResponse")
    if reply["ok"] is True:
        return reply.get("result")
    kind = str(reply.get("kind", "RelayError"))
    raise ControlRequestError(str(reply.get("error", "request failed")), kind)
