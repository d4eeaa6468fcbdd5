"""The worker's control socket: ``<run dir>/relay.sock``.

Serves newline-delimited JSON requests from the CLI and turns each into the bus
command the daemon itself handles. Built only from a held :class:`ProcessLock`,
so a stale socket left by a killed worker is unlinked only after this process
owns the run directory. Mode 0600 inside the 0700 run directory, and the peer's
uid is checked (root or the worker's own uid).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import structlog
from anyio.abc import SocketAttribute, SocketStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

from relay.adapters.control.lock import ProcessLock
from relay.adapters.control.protocol import (
    MAX_REQUEST_BYTES,
    decode_request,
    error_response,
    ok_response,
)
from relay.domain.errors import RelayError
from relay.domain.messages import Command

_log = structlog.get_logger(__name__)

Send = Callable[[Command], Awaitable[Any]]
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class ControlServer:
    """Answers control requests by sending commands through ``send`` (``MessageBus.send``)."""

    def __init__(
        self,
        lock: ProcessLock,
        send: Send,
        *,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        read_timeout: float = 10.0,
        allowed_uids: frozenset[int] | None = None,
        max_connections: int = 16,
    ) -> None:
        self._lock = lock
        self._send = send
        self._max = max_request_bytes
        self._read_timeout = read_timeout
        self._allowed = allowed_uids if allowed_uids is not None else frozenset({0, os.getuid()})
        self.path = lock.socket_path
        self._connections = anyio.CapacityLimiter(max_connections)

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Bind, report started, serve until cancelled; the socket is removed on exit."""
        if not self._lock.held:
            raise RelayError("the control socket needs the process lock first")
        self._remove_stale()
        listener = await anyio.create_unix_listener(self.path, mode=0o600)
        _log.info("control_socket_listening", path=str(self.path))
        try:
            async with listener:
                task_status.started()
                await listener.serve(self._handle)
        finally:
            self._unlink()

    def _remove_stale(self) -> None:
        try:
            mode = self.path.lstat().st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise RelayError(f"{self.path} exists and is not a socket")
        _log.info("control_socket_stale_removed", path=str(self.path))
        self.path.unlink()

    def _unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _handle(self, stream: SocketStream) -> None:
        # One connection's trouble must never reach the listener's task group:
        # that would stop the socket (and the worker) for every other client.
        async with stream, self._connections:
            try:
                await self._converse(stream)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
                _log.debug("control_client_went_away")
            except Exception:  # noqa: BLE001 - logged; the server keeps serving
                _log.exception("control_connection_failed")

    async def _converse(self, stream: SocketStream) -> None:
        uid = _peer_uid(stream)
        if uid not in self._allowed:
            _log.warning("control_peer_refused", uid=uid)
            refusal = error_response(f"permission denied for uid {uid}", "PermissionDenied")
            await stream.send(refusal)
            return
        reader = BufferedByteReceiveStream(stream)
        while True:
            try:
                with anyio.fail_after(self._read_timeout):
                    line = await reader.receive_until(b"\n", self._max)
                too_large = len(line) > self._max  # a single read may overshoot the cap
            except anyio.IncompleteRead:
                return  # the client closed its side: done
            except anyio.DelimiterNotFound:
                too_large = True
            except TimeoutError:
                await stream.send(error_response("request timed out", "RequestTimeout"))
                return
            if too_large:
                msg = f"request too large (limit {self._max} bytes)"
                await stream.send(error_response(msg, "RequestTooLarge"))
                return
            await stream.send(await self._answer(line))

    async def _answer(self, line: bytes) -> bytes:
        try:
            command = decode_request(line)
            result = await self._send(command)
        except RelayError as exc:
            return error_response(str(exc), type(exc).__name__)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the server
            _log.exception("control_request_failed")
            return error_response(f"internal error: {type(exc).__name__}: {exc}", "InternalError")
        return ok_response(result)


def _peer_uid(stream: SocketStream) -> int:
    raw: socket.socket = stream.extra(SocketAttribute.raw_socket)  # noqa: S610 - anyio, not Django
    creds = raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    _pid, uid, _gid = _PEERCRED.unpack(creds)
    return int(uid)
